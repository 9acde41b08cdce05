"""examples/install_decode.py's graph-mode step on the CPU: a small transformers Llama
decoding on a static cache, the position set before every step as before every
replay (the warm-up steps included), gives the dynamic cache's logits, and never
writes past the cache's end. Needs torch and transformers (skipped without)."""

import pytest
from repo_file import load

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@torch.inference_mode()
def test_static_step_matches_the_dynamic_cache():
    example = load("examples/install_decode.py", "install_decode")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                      max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    b, steps = 3, 6
    prompt = torch.randint(0, config.vocab_size, (b, example.PROMPT))
    forced = torch.randint(0, config.vocab_size, (b, steps))

    out = model(input_ids=prompt, use_cache=True)
    cache, want = out.past_key_values, []
    for i in range(steps):
        out = model(input_ids=forced[:, i : i + 1], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        want.append(out.logits[:, -1])

    s = example.StaticStep(model, prompt, steps)
    for _ in range(3):  # warm-up steps, as before a capture: they must not move the next step
        s.at(0, forced[:, :1])
        s.step()
    for i in range(steps):
        s.at(i, forced[:, i : i + 1])
        got = s.step()
        torch.testing.assert_close(got, want[i], rtol=1e-4, atol=1e-4, msg=f"step {i}")
