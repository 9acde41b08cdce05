"""A HuggingFace LlamaDecoderLayer (hidden 4096, random weights) sharded TP 2 by hand:
q/k/v/gate/up by columns (output features), o/down by rows (input features). One
decode step with a KV cache; after the o-projection the all-reduce + residual add +
post-attention RMSNorm is one ``team.ar_norm`` (the MLP's all-reduce
``team.all_reduce``), against the same sharded layer on ``dist.all_reduce`` and torch
math. Checks both against the unsharded layer (whose step is first checked against
HF's own ``LlamaDecoderLayer.forward``) and prints per-step latency, each step one
CUDA graph.

    torchrun --nproc-per-node 2 examples/llama_tp_layer.py [--batch 1 2 4 8] [--cache 512]
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding, apply_rotary_pos_emb

import tpdecode


def by_output(w, rank, size):  # column parallel: this rank's output features
    return w.chunk(size, 0)[rank].contiguous()


def by_input(w, rank, size):  # row parallel: this rank's input features
    return w.chunk(size, 1)[rank].contiguous()


class ShardedLayer:
    """One rank's shard of a LlamaDecoderLayer, run as a decode step over a KV cache."""

    def __init__(self, layer, config, rank, size, k_cache, v_cache):
        a, m = layer.self_attn, layer.mlp
        self.d = config.hidden_size // config.num_attention_heads
        self.heads = config.num_attention_heads // size
        self.kv_heads = config.num_key_value_heads // size
        self.wq, self.wk, self.wv = (by_output(p.weight, rank, size) for p in (a.q_proj, a.k_proj, a.v_proj))
        self.wo = by_input(a.o_proj.weight, rank, size)
        self.wg, self.wu = by_output(m.gate_proj.weight, rank, size), by_output(m.up_proj.weight, rank, size)
        self.wd = by_input(m.down_proj.weight, rank, size)
        self.ln1, self.ln2 = layer.input_layernorm, layer.post_attention_layernorm
        self.k_cache = k_cache.chunk(size, 1)[rank].contiguous()  # [b, kv heads, L, d]
        self.v_cache = v_cache.chunk(size, 1)[rank].contiguous()

    def step(self, h, cos, sin, comm, team=None):
        """h: [b, 1, hidden]. comm: "none" (unsharded), "torch" or "tpdecode"."""
        b = h.shape[0]
        x = self.ln1(h)
        q = (x @ self.wq.t()).view(b, 1, self.heads, self.d).transpose(1, 2)
        k = (x @ self.wk.t()).view(b, 1, self.kv_heads, self.d).transpose(1, 2)
        v = (x @ self.wv.t()).view(b, 1, self.kv_heads, self.d).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        keys, values = torch.cat([self.k_cache[:b], k], 2), torch.cat([self.v_cache[:b], v], 2)
        attn = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)
        o = attn.transpose(1, 2).reshape(b, 1, self.heads * self.d) @ self.wo.t()  # partial sums
        if comm == "tpdecode":
            x2, h2 = team.ar_norm(o, h, self.ln2.weight, self.ln2.variance_epsilon)
        else:
            if comm == "torch":
                dist.all_reduce(o)
            h2 = h + o
            x2 = self.ln2(h2)
        mlp = (F.silu(x2 @ self.wg.t()) * (x2 @ self.wu.t())) @ self.wd.t()
        if comm == "tpdecode":
            mlp = team.all_reduce(mlp)
        elif comm == "torch":
            dist.all_reduce(mlp)
        return h2 + mlp


def graph_us(fn, replays=200):
    """Mean time of one replay of fn captured in one CUDA graph (µs), and its output."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    for _ in range(20):
        g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dist.barrier()
    torch.cuda.synchronize()
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / replays, out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--cache", type=int, default=512, help="KV cache length before the step")
    args = p.parse_args()
    rank, local = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    size = dist.get_world_size()
    team = tpdecode.Team.from_process_group(hidden=4096, rows=max(args.batch))

    config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                         max_position_embeddings=4096)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)  # the same full layer on every rank
    with torch.device("cuda"):
        layer = LlamaDecoderLayer(config, layer_idx=0).to(torch.bfloat16).eval()
        rope = LlamaRotaryEmbedding(config)
    for prm in layer.parameters():
        prm.requires_grad_(False)
    d, bmax = config.hidden_size // config.num_attention_heads, max(args.batch)
    k_cache, v_cache = (torch.randn(bmax, config.num_key_value_heads, args.cache, d, device="cuda",
                                    dtype=torch.bfloat16) for _ in range(2))
    full = ShardedLayer(layer, config, 0, 1, k_cache, v_cache)
    shard = ShardedLayer(layer, config, rank, size, k_cache, v_cache)

    with torch.inference_mode():
        # The hand-written step is HF's layer: check it with no cache (position 0).
        h0 = torch.randn(2, 1, 4096, device="cuda", dtype=torch.bfloat16)
        pos0 = torch.zeros(2, 1, dtype=torch.long, device="cuda")
        cos0, sin0 = rope(h0, pos0)
        hf = layer(h0, position_embeddings=(cos0, sin0), position_ids=pos0, attention_mask=None)
        hf = hf[0] if isinstance(hf, tuple) else hf
        mine = ShardedLayer(layer, config, 0, 1, k_cache[:, :, :0], v_cache[:, :, :0]).step(h0, cos0, sin0, "none")
        torch.testing.assert_close(mine.float(), hf.float(), rtol=2**-6, atol=2**-6)

        rows = []
        for b in args.batch:
            h = torch.randn(b, 1, 4096, device="cuda", dtype=torch.bfloat16) * 0.5
            dist.broadcast(h, 0)  # the replicated hidden state
            cos, sin = rope(h, torch.full((b, 1), args.cache, dtype=torch.long, device="cuda"))
            want = full.step(h, cos, sin, "none").float()
            t_torch, out_torch = graph_us(lambda: shard.step(h, cos, sin, "torch"))
            t_ours, out_ours = graph_us(lambda: shard.step(h, cos, sin, "tpdecode", team))
            scale = want.abs().max().item()
            err_torch = (out_torch.float() - want).abs().max().item() / scale
            err_ours = (out_ours.float() - want).abs().max().item() / scale
            assert err_ours < 2**-6, f"tpdecode layer output off by {err_ours:.3g} (relative to max)"
            rows.append((b, t_torch, t_ours, err_torch, err_ours))
        team.check_errors()
    if rank == 0:
        print(f"LlamaDecoderLayer hidden 4096, TP {size}, KV cache {args.cache}, one CUDA graph per step; "
              f"{torch.cuda.get_device_name()}")
        print(f"{'batch':>5} {'dist.all_reduce us':>19} {'tpdecode us':>12} {'speedup':>8} "
              f"{'err torch':>10} {'err tpdecode':>13}   (max |out - unsharded| / max |unsharded|)")
        for b, t1, t2, e1, e2 in rows:
            print(f"{b:>5} {t1:>19.1f} {t2:>12.1f} {t1 / t2:>7.2f}x {e1:>10.2e} {e2:>13.2e}")
    team.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
