"""A HuggingFace Llama (built from a config: a few layers, random weights, BF16)
decoding batch 1-8 greedily, stock and with tpdecode.torch.install: the installed
model is fed the stock run's tokens (teacher forcing), so every step's logits are
compared (argmax equal, max |difference|) and the per-token latency is shown side by
side (eager decode steps, a KV cache, synchronised per token). Why warm-up runs and
interleaved rounds: whatever the process pays once (kernel loading, allocator growth,
clocks ramping) must not land on whichever path runs first; each path's figure is the
median step over its rounds, and the spread of its round medians is shown.

    python examples/install_decode.py [--layers 4] [--steps 32] [--batch 1 2 4 8] [--rounds 3]
"""

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tpdecode import DecodeGemm
from tpdecode.torch import install, uninstall


def build(layers: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=32768, max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    return model.eval()


@torch.inference_mode()
def decode(model, prompt, steps, forced=None):
    """Greedy decode of `steps` tokens after `prompt`; with `forced`, those tokens are
    fed instead of the argmax. Returns (tokens [b, steps], logits per step, s/token)."""
    out = model(input_ids=prompt, use_cache=True)
    cache, tokens, logits, times = out.past_key_values, [], [], []
    step_logits = out.logits[:, -1]
    for i in range(steps):
        logits.append(step_logits.float())
        tokens.append(step_logits.argmax(-1) if forced is None else forced[:, i])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=tokens[-1][:, None], past_key_values=cache, use_cache=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        cache, step_logits = out.past_key_values, out.logits[:, -1]
    return torch.stack(tokens, 1), logits, times


def median(values):
    v = sorted(values)
    return v[len(v) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per path, interleaved")
    args = p.parse_args()
    model = build(args.layers)
    rows = range(1, max(args.batch) + 1)
    print(f"Llama: {args.layers} layers, hidden 4096, BF16, random weights; {torch.cuda.get_device_name()}")
    print(f"{'batch':>5} {'stock ms/tok':>13} {'tpdecode ms/tok':>16} {'speedup':>8} {'argmax equal':>13} "
          f"{'max|dlogit|':>12} {'round spread stock / tpdecode':>30}")
    for b in args.batch:
        prompt = torch.randint(0, model.config.vocab_size, (b, 16), device="cuda")
        # Untimed first runs: the reference tokens and logits, then the installed model's.
        tokens, ref_logits, _ = decode(model, prompt, args.steps)
        routed = install(model, rows=rows)
        _, logits, _ = decode(model, prompt, args.steps, forced=tokens)
        uninstall(model)
        rounds = {"stock": [], "tpdecode": []}
        for _ in range(args.rounds):
            rounds["stock"].append(decode(model, prompt, args.steps, forced=tokens)[2])
            install(model, rows=rows)
            rounds["tpdecode"].append(decode(model, prompt, args.steps, forced=tokens)[2])
            uninstall(model)
        t_stock = median([t for r in rounds["stock"] for t in r])
        t_ours = median([t for r in rounds["tpdecode"] for t in r])
        spread = {k: max(median(r) for r in v) / min(median(r) for r in v) - 1 for k, v in rounds.items()}
        same = sum(int(torch.equal(a.argmax(-1), r.argmax(-1))) for a, r in zip(logits, ref_logits))
        diff = max((a - r).abs().max().item() for a, r in zip(logits, ref_logits))
        print(f"{b:>5} {t_stock * 1e3:>13.3f} {t_ours * 1e3:>16.3f} {t_stock / t_ours:>7.2f}x "
              f"{same:>6}/{args.steps:<6} {diff:>12.4f} {spread['stock']:>14.1%} / {spread['tpdecode']:<.1%}")
    print(f"({routed} linears routed, lm_head included; prefill rows above {DecodeGemm.max_rows} run the original forward)")


if __name__ == "__main__":
    main()
