"""A decoder layer's stretch between two attentions at TP 1 (o_proj, residual add +
norm, gate_up, SiLU-mul, down, residual add + norm, qkv) three ways, each inside a
torch CUDA graph (GPU µs per block, the median of the replays; one block's weights
are far larger than L2, so every block streams them from HBM):

  torch       F.linear and torch's elementwise ops
  DecodeGemm  tpdecode.DecodeGemm for every linear, torch's glue
  MlpBlock    tpdecode.MlpBlock: the whole stretch as one persistent kernel, or as
              launches (its form for the rows, or the one --form asks for)

    python examples/bench_mlp_block.py [--hidden 4096 --inter 14336 --qkv 6144 --rows 1 8 28 64]
                                       [--form program|launches]
"""

import argparse
import json

import torch
import torch.nn.functional as F

import tpdecode
from bench_ops import bf16_source, in_graph_us  # this script's directory is on sys.path

EPS = 1e-6


def add_norm(residual, x, gamma):
    residual.copy_(residual + x)
    r = residual.float()
    return (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + EPS)).to(torch.bfloat16) * gamma


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--inter", type=int, default=14336)
    p.add_argument("--qkv", type=int, default=6144)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 28, 64])
    p.add_argument("--form", choices=["program", "launches"], help="MlpBlock's form (default: its own choice)")
    p.add_argument("--json", help="write the table here")
    args = p.parse_args()
    H, I, Q = args.hidden, args.inter, args.qkv
    rand = bf16_source()

    w = {"o_proj": rand(H, H, scale=H**-0.5), "post_norm": rand(H), "gate_up": rand(2 * I, H, scale=H**-0.5),
         "down": rand(H, I, scale=I**-0.5), "next_norm": rand(H), "qkv": rand(Q, H, scale=H**-0.5)}
    weight_bytes = sum(t.numel() * 2 for k, t in w.items() if k in ("o_proj", "gate_up", "down", "qkv"))
    gemms = {k: tpdecode.DecodeGemm(w[k]) for k in ("o_proj", "gate_up", "down", "qkv")}
    rows = []
    for m in args.rows:
        attn, r0 = rand(m, H), rand(m, H, scale=2.0)
        residual, out = r0.clone(), torch.empty(m, Q, device="cuda", dtype=torch.bfloat16)
        for gemm in gemms.values():
            gemm.prepare(m)

        def layer(linear):
            o = linear("o_proj", attn)
            h = add_norm(residual, o, w["post_norm"])
            gu = linear("gate_up", h)
            y = linear("down", F.silu(gu[:, :I]) * gu[:, I:])
            out.copy_(linear("qkv", add_norm(residual, y, w["next_norm"])))

        block = tpdecode.MlpBlock(**w, attn=attn, residual=residual, out=out, eps=EPS, form=args.form)
        residual.copy_(r0)
        layer(lambda k, x: F.linear(x, w[k]))
        want = (out.clone(), residual.clone())
        residual.copy_(r0)
        block()
        err = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip((out, residual), want))
        # 8 blocks a graph: one block's weights alone are far larger than L2.
        t = {"torch": in_graph_us(lambda: layer(lambda k, x: F.linear(x, w[k])), ops=8),
             "DecodeGemm": in_graph_us(lambda: layer(lambda k, x: gemms[k](x)), ops=8),
             "MlpBlock": in_graph_us(block, ops=8)}
        row = {"rows": m, **{k: round(v, 2) for k, v in t.items()}, "weight_GBps": {
            k: round(weight_bytes / v / 1e3, 1) for k, v in t.items()}, "relative_error_vs_torch": round(err, 5),
            "form": block.form, "folded": [block.post_norm_folded, block.next_norm_folded]}
        rows.append(row)
        print(f"M {m:3d}: torch {t['torch']:8.2f} µs  DecodeGemm {t['DecodeGemm']:8.2f}  MlpBlock "
              f"{t['MlpBlock']:8.2f}  ({t['torch'] / t['MlpBlock']:.3f} × torch, "
              f"{t['DecodeGemm'] / t['MlpBlock']:.3f} × DecodeGemm; weights at "
              f"{weight_bytes / t['MlpBlock'] / 1e3:.0f} GB/s; {block.form}; rel. error vs torch {err:.4f})")
        del block
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hidden": H, "inter": I, "qkv": Q, "weight_bytes": weight_bytes, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
