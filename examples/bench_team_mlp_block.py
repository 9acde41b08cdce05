"""A decoder layer's stretch between two attentions at TP > 1 on a local team (every
rank on one GPU: the team's protocol, not NVLink), two ways, each inside a torch CUDA
graph (GPU µs per block, the median of the replays):

  launches   torch.bmm over the ranks' shards for every linear (one kernel streams
             every rank's shard), tpdecode's Team.ar_norm for both all-reduce +
             residual + norms, torch's SiLU-mul
  MlpBlock   tpdecode.MlpBlock(team=...): one persistent kernel per rank, each on its
             share of the SMs, the all-reduces inside

Both stream the whole layer's weights once per block (all ranks' shards together are
the TP 1 layer's bytes), so the GB/s column compares with the GPU's read ceiling.

    python examples/bench_team_mlp_block.py [--tp 2 4 8] [--hidden 7168 --inter 18432 --qkv 2112]
                                            [--rows 1 8 16 32] [--json F]
"""

import argparse
import json

import torch
import torch.nn.functional as F

import tpdecode
from bench_ops import bf16_source, in_graph_us  # this script's directory is on sys.path

EPS = 1e-6


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--inter", type=int, default=18432)
    p.add_argument("--qkv", type=int, default=2112)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32])
    p.add_argument("--json", help="write the table here")
    args = p.parse_args()
    H, I, Q = args.hidden, args.inter, args.qkv
    rand = bf16_source()

    rows = []
    for tp in args.tp:
        team = tpdecode.Team.local(tp, hidden=H, rows=max(args.rows))
        # Every rank's shards, [tp, ...]: o_proj and down row-parallel, gate_up and qkv
        # column-parallel (each rank's gate rows, then its up rows).
        w = {"o_proj": rand(tp, H, H // tp, scale=H**-0.5), "post_norm": rand(H),
             "gate_up": rand(tp, 2 * I // tp, H, scale=H**-0.5), "down": rand(tp, H, I // tp, scale=I**-0.5),
             "next_norm": rand(H), "qkv": rand(tp, Q // tp, H, scale=H**-0.5)}
        weight_bytes = sum(w[k].numel() * 2 for k in ("o_proj", "gate_up", "down", "qkv"))
        t_w = {k: w[k].transpose(1, 2) for k in ("o_proj", "gate_up", "down", "qkv")}
        inter = I // tp
        for m in args.rows:
            attn, r0 = rand(tp, m, H // tp), rand(m, H, scale=2.0).expand(tp, m, H).contiguous()
            residual = r0.clone()
            out = torch.empty(tp, m, Q // tp, device="cuda", dtype=torch.bfloat16)
            h, h2 = torch.empty(tp, m, H, device="cuda", dtype=torch.bfloat16), torch.empty_like(residual)

            def launches():
                team.ar_norm(torch.bmm(attn, t_w["o_proj"]), residual, w["post_norm"], EPS, out=h,
                             residual_out=residual)
                gu = torch.bmm(h, t_w["gate_up"])
                y = torch.bmm(F.silu(gu[..., :inter]) * gu[..., inter:], t_w["down"])
                team.ar_norm(y, residual, w["next_norm"], EPS, out=h2, residual_out=residual)
                torch.bmm(h2, t_w["qkv"], out=out)

            def block_of(form):
                try:
                    return tpdecode.MlpBlock(**w, attn=attn, residual=residual, out=out, eps=EPS, team=team, form=form)
                except (ValueError, tpdecode.Unavailable) as refusal:  # a norm's share above what a CTA holds
                    print(f"local TP {tp} M {m:3d}: MlpBlock({form}) not served: {refusal}")
                    return None

            residual.copy_(r0)
            launches()
            want = (out.clone(), residual.clone())
            t = {"torch+ar_norm": in_graph_us(launches, ops=8)}
            err = {}
            for form in ("program", "launches"):
                block = block_of(form)
                if block is None:
                    continue
                residual.copy_(r0)
                block()
                team.synchronize()
                err[form] = round(max(((a.float() - b.float()).norm() / b.float().norm()).item()
                                      for a, b in zip((out, residual), want)), 5)
                t[form] = in_graph_us(block, ops=8)
                del block
            row = {"tp": tp, "rows": m, **{k: round(v, 2) for k, v in t.items()},
                   "weight_GBps": {k: round(weight_bytes / v / 1e3, 1) for k, v in t.items()},
                   "relative_error_vs_torch": err}
            rows.append(row)
            base = t["torch+ar_norm"]
            print(f"local TP {tp} M {m:3d}: torch+ar_norm {base:8.2f} µs" + "".join(
                f"  MlpBlock {k} {v:8.2f} ({base / v:.3f} ×)" for k, v in t.items() if k != "torch+ar_norm") +
                f"  (rel. error vs torch {err})")
        team.synchronize()
        team.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hidden": H, "inter": I, "qkv": Q, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
