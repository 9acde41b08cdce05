"""A HuggingFace Llama (built from a config: a few layers, random weights, BF16)
decoding batch 1-8 greedily, stock and with tpdecode.torch.install, in two regimes:
eager (a dynamic KV cache, one Python forward per token) and graph mode (a static KV
cache and the decode step captured once in a CUDA graph, replayed per token: what
serving engines run). The installed model is fed the stock run's tokens (teacher
forcing), so every step's logits are compared (argmax equal, max |difference|).
ms per token is the median step of interleaved rounds (whatever the process pays
once must not land on whichever path runs first); beside it the floor: the bytes of
weights a step reads over the device's copy bandwidth measured in the same run.

    python examples/install_decode.py [--layers 4] [--steps 32] [--batch 1 2 4 8] [--rounds 3]
"""

import argparse
import inspect
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

from tpdecode import DecodeGemm
from tpdecode.torch import install, uninstall

PROMPT = 16


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
def decode_eager(model, prompt, steps, forced=None):
    """Greedy decode of `steps` tokens after `prompt` (dynamic cache, one forward per
    token); with `forced`, those tokens are fed instead of the argmax. Returns
    (tokens [b, steps], logits per step, s per token)."""
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


def static_cache(model, batch: int, length: int, device="cuda") -> StaticCache:
    # Why by signature: the constructor's arguments changed across transformers versions
    # (older ones take the batch size, device and dtype; newer ones size lazily).
    params = inspect.signature(StaticCache.__init__).parameters
    kwargs = {"config": model.config, "max_cache_len": length}
    for name, value in (("max_batch_size", batch), ("batch_size", batch), ("device", device),
                        ("dtype", model.dtype)):
        if name in params:
            kwargs[name] = value
    return StaticCache(**kwargs)


def set_position(cache, position: torch.Tensor, value: int) -> None:
    """Makes the next forward on `cache` write and attend at `value`: the position
    tensor the forward is given (older transformers place the new keys and values
    at cache_position) and the cache's own count where it keeps one (transformers 5's
    static layers place them at `cumulative_length`, a device tensor that every
    forward advances in place, a graph replay included: without this each warm-up
    and replay writes one slot further, past the cache's end)."""
    position.fill_(value)
    for layer in getattr(cache, "layers", ()):
        count = getattr(layer, "cumulative_length", None)
        if isinstance(count, torch.Tensor):
            count.fill_(value)


class StaticStep:
    """One decode step of `model` on a static cache holding `prompt` [b, PROMPT] and
    room for `steps` more tokens: ``at(i, token)`` feeds `token` [b, 1] at position
    PROMPT + i, ``step()`` runs the forward and returns the last logits [b, vocab]
    (its inputs are fixed tensors, so a CUDA graph can capture it)."""

    def __init__(self, model, prompt: torch.Tensor, steps: int):
        b, prompt_len = prompt.shape
        self.model, self.prompt_len = model, prompt_len
        self.cache = static_cache(model, b, prompt_len + steps, prompt.device)
        # Why by signature: transformers 5 takes no cache_position (the cache counts).
        self.cache_position = "cache_position" in inspect.signature(model.forward).parameters
        positions = torch.arange(prompt_len, device=prompt.device)
        extra = {"cache_position": positions} if self.cache_position else {}
        model(input_ids=prompt, past_key_values=self.cache, position_ids=positions[None], use_cache=True, **extra)
        self.token = torch.zeros(b, 1, dtype=prompt.dtype, device=prompt.device)
        self.position = torch.tensor([prompt_len], device=prompt.device)

    def at(self, i: int, token: torch.Tensor) -> None:
        self.token.copy_(token)
        set_position(self.cache, self.position, self.prompt_len + i)

    def step(self) -> torch.Tensor:
        extra = {"cache_position": self.position} if self.cache_position else {}
        out = self.model(input_ids=self.token, past_key_values=self.cache, position_ids=self.position[None],
                         use_cache=True, **extra)
        return out.logits[:, -1]


@torch.inference_mode()
def decode_graph(model, prompt, forced):
    """The decode step captured once with a static cache and replayed for each token of
    `forced` [b, steps]. Returns (logits per step, s per token)."""
    steps = forced.shape[1]
    s = StaticStep(model, prompt, steps)
    side = torch.cuda.Stream()  # warm-up off the capture stream (torch.cuda.graph's pattern)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            s.at(0, forced[:, :1])
            s.step()
    torch.cuda.current_stream().wait_stream(side)
    s.at(0, forced[:, :1])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = s.step()
    out, times = [], []
    for i in range(steps):
        s.at(i, forced[:, i : i + 1])  # the position set anew before every replay
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        out.append(logits.float().clone())
    return out, times


def median(values):
    v = sorted(values)
    return v[len(v) // 2]


def copy_bandwidth() -> float:
    """Bytes per second of a device-to-device copy of 1 GiB (read + write counted)."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        b.copy_(a)
    end.record()
    end.synchronize()
    return 2 * a.numel() * 10 / (start.elapsed_time(end) / 1e3)


def weight_bytes(model) -> int:
    """What one decode step reads of weights: every linear (lm_head included) and the
    norms (the embedding reads only the batch's rows)."""
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)


def compare(logits, ref_logits):
    same = sum(int(torch.equal(a.argmax(-1), r.argmax(-1))) for a, r in zip(logits, ref_logits))
    diff = max((a - r).abs().max().item() for a, r in zip(logits, ref_logits))
    return same, diff


def rounds_of(run, model, rows, rounds):
    """Median s/token of `run(model)` stock and installed, interleaved over `rounds`;
    and each path's first run's result."""
    times = {"stock": [], "tpdecode": []}
    first = {}
    for _ in range(rounds):
        for path in ("stock", "tpdecode"):
            if path == "tpdecode":
                install(model, rows=rows)
            result, t = run(model)
            first.setdefault(path, result)
            times[path].append(median(t))
            if path == "tpdecode":
                uninstall(model)
    return median(times["stock"]), median(times["tpdecode"]), first


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per path, interleaved")
    args = p.parse_args()
    model = build(args.layers)
    rows = range(1, max(args.batch) + 1)
    floor_ms = weight_bytes(model) / copy_bandwidth() * 1e3
    print(f"Llama: {args.layers} layers, hidden 4096, BF16, random weights; {torch.cuda.get_device_name()}; "
          f"floor {floor_ms:.3f} ms/token ({weight_bytes(model) / 1e9:.2f} GB of weights per step / the copy "
          f"bandwidth measured now)")
    print(f"{'batch':>5} {'mode':>6} {'stock ms/tok':>13} {'tpdecode ms/tok':>16} {'speedup':>8} {'tpdecode/floor':>15} "
          f"{'argmax equal':>13} {'max|dlogit|':>12}")
    for b in args.batch:
        prompt = torch.randint(0, model.config.vocab_size, (b, PROMPT), device="cuda")
        tokens, _, _ = decode_eager(model, prompt, args.steps)  # the reference tokens (untimed)
        modes = [("eager", lambda m: decode_eager(m, prompt, args.steps, forced=tokens)[1:])]
        modes.append(("graph", lambda m: decode_graph(m, prompt, tokens)))
        for mode, run in modes:
            try:
                t_stock, t_ours, first = rounds_of(run, model, rows, args.rounds)
            except Exception as e:  # noqa: BLE001 (a transformers whose decode step cannot be captured)
                print(f"{b:>5} {mode:>6} not run: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                uninstall(model)
                continue
            # Against the stock run of the same mode (graph mode's static cache attends
            # over a padded length: its logits differ from eager's in the last bits).
            same, diff = compare(first["tpdecode"], first["stock"])
            print(f"{b:>5} {mode:>6} {t_stock * 1e3:>13.3f} {t_ours * 1e3:>16.3f} {t_stock / t_ours:>7.2f}x "
                  f"{t_ours * 1e3 / floor_ms:>15.2f} {same:>6}/{args.steps:<6} {diff:>12.4f}")
    print(f"(every BF16 linear routed, lm_head included; rows above {DecodeGemm.max_rows} (prefill) run F.linear; "
          f"argmax equal: tpdecode's steps against stock's in the same mode, teacher-forced on the eager stock tokens)")


if __name__ == "__main__":
    main()
