#include "drafter/config.hpp"

#include <fmt/format.h>

#include "tpdecode/error.hpp"

namespace tpdecode::drafter {

DrafterConfig DrafterConfig::reference() { return {}; }

DrafterConfig DrafterConfig::reduced_cpu() {
  DrafterConfig c;
  c.hidden = 512;
  c.layers = 2;
  c.q_lora = 256;
  c.kv_lora = 128;
  c.rope = 32;
  c.nope = 64;
  c.v_head = 64;
  c.heads = 8;
  c.intermediate = 1024;
  c.vocab = 2048;
  c.context_layers = 2;
  return c;
}

DrafterConfig DrafterConfig::reduced_gpu() {
  DrafterConfig c;
  c.hidden = 4096;
  c.layers = 2;
  c.heads = 16;
  c.intermediate = 4096;
  c.vocab = 16384;
  c.context_layers = 2;
  return c;
}

std::string DrafterConfig::describe() const {
  return fmt::format(
      "hidden {}, {} layers, q_lora {}, kv_lora {}, rope {}, nope {}, v {}, {} heads, MLP {}, vocabulary {}, "
      "context {}·{}",
      hidden, layers, q_lora, kv_lora, rope, nope, v_head, heads, intermediate, vocab, context_layers, hidden);
}

std::string shard_refusal(const DrafterConfig& c, int tp) {
  if (tp < 1) return fmt::format("team size {} is not positive", tp);
  if (c.layers < 1 || c.hidden < 8 || c.heads < 1 || c.context_layers < 1)
    return "layers, hidden, heads and context layers must be positive";
  if (c.layers > 254) return "at most 254 layers (the weight hash keys a layer in 8 bits)";
  if (c.v_head != c.nope) return fmt::format("the attention stand-in needs v_head == nope ({} vs {})", c.v_head, c.nope);
  const auto split = [&](int64_t n, const char* what) -> std::string {
    if (n % tp != 0) return fmt::format("{} {} does not split over {} ranks", what, n, tp);
    if ((n / tp) % 8 != 0) return fmt::format("{} {} / {} ranks is not a multiple of 8", what, n, tp);
    return {};
  };
  if (c.heads % tp != 0) return fmt::format("{} heads do not split over {} ranks", c.heads, tp);
  for (const std::string& why : {split(c.intermediate, "MLP intermediate"),
                                 split(c.vocab, "vocabulary"), split(c.hidden, "hidden")})
    if (!why.empty()) return why;
  for (int64_t w : {c.hidden, c.q_lora, c.kv_lora, c.rope, c.nope})
    if (w % 8 != 0) return fmt::format("width {} is not a multiple of 8", w);
  return {};
}

RankShapes rank_shapes(const DrafterConfig& c, int tp) {
  const std::string why = shard_refusal(c, tp);
  require(why.empty(), "drafter: " + why);
  RankShapes s;
  s.tp = tp;
  s.heads = c.heads / tp;
  s.q = s.heads * c.qk_head();
  s.attn = s.heads * c.v_head;
  s.intermediate = c.intermediate / tp;
  s.gate_up = 2 * s.intermediate;
  s.vocab = c.vocab / tp;
  s.context = c.hidden / tp;
  return s;
}

}  // namespace tpdecode::drafter
