#include "drafter/cpu_checks.hpp"

#include <fmt/format.h>

#include <cmath>

#include "core/bf16.hpp"
#include "drafter/cpu_reference.hpp"
#include "drafter/step.hpp"

namespace tpdecode::drafter {

bool shards_tile_weight(const DrafterConfig& config, WeightId id, int tp) {
  const FillSpec whole = weight_fill(config, id, 1, 0);
  const std::vector<uint16_t> full = host_fill(whole);
  std::vector<int> seen(full.size(), 0);
  for (int r = 0; r < tp; ++r) {
    const FillSpec f = weight_fill(config, id, tp, r);
    const std::vector<uint16_t> shard = host_fill(f);
    for (int64_t j = 0; j < f.map.rows; ++j)
      for (int64_t c = 0; c < f.map.cols; ++c) {
        const auto at = static_cast<std::size_t>(f.map.global_row(j) * whole.map.cols + f.map.col0 + c);
        if (shard[static_cast<std::size_t>(j * f.map.cols + c)] != full[at]) return false;
        ++seen[at];
      }
  }
  // Replicated weights: every rank holds all; sharded ones: each element once.
  const int expected = id.tensor == Tensor::kQkvA ? tp : 1;
  for (int s : seen)
    if (s != expected) return false;
  return true;
}

std::vector<CheckResult> check_cpu_reference(const DrafterConfig& c, int rows) {
  std::vector<CheckResult> out;
  CpuReference a(c, rows), b(c, rows);
  a.run();
  b.run();
  const std::vector<uint16_t>& logits = a.buffer(Buf::kLogits);
  out.push_back({"deterministic", logits == b.buffer(Buf::kLogits) && a.tokens() == b.tokens(),
                 "two runs: identical logits and tokens"});

  // Argmax rule: the token's logit is the row maximum and no lower index equals it.
  bool argmax_ok = true;
  for (int m = 0; m < rows; ++m) {
    const int32_t t = a.tokens()[static_cast<std::size_t>(m)];
    const float best = bf16::to_float(logits[static_cast<std::size_t>(m * c.vocab + t)]);
    for (int64_t j = 0; j < c.vocab; ++j) {
      const float v = bf16::to_float(logits[static_cast<std::size_t>(m * c.vocab + j)]);
      if (v > best || (v == best && j < t)) argmax_ok = false;
    }
  }
  out.push_back({"argmax", argmax_ok, "each token is the lowest index of its row's largest logit"});

  // Final norm: RMS(hidden / weight) is 1 up to BF16 rounding.
  CpuReference& ref = a;
  const std::vector<uint16_t>& w = ref.weight({Tensor::kInputNorm, c.layers});
  const std::vector<uint16_t>& hidden = ref.buffer(Buf::kHidden);
  double worst = 0;
  for (int m = 0; m < rows; ++m) {
    double ss = 0;
    for (int64_t j = 0; j < c.hidden; ++j) {
      const double v = bf16::to_float(hidden[static_cast<std::size_t>(m * c.hidden + j)]) /
                       bf16::to_float(w[static_cast<std::size_t>(j)]);
      ss += v * v;
    }
    // Why not std::max: it keeps the old value against a NaN, which would pass the check.
    const double off = std::abs(std::sqrt(ss / static_cast<double>(c.hidden)) - 1.0);
    if (std::isnan(off) || off > worst) worst = off;
    if (std::isnan(worst)) break;
  }
  out.push_back({"final norm", worst < 5e-3, fmt::format("largest |RMS(hidden / weight) - 1| = {:.2e}", worst)});

  // Hand-recomputed logits: row m, a few columns, FP64 dot product rounded once.
  const std::vector<uint16_t>& head_in = ref.buffer(Buf::kHeadIn);
  const std::vector<uint16_t>& lm = ref.weight({Tensor::kLmHead, 0});
  int logit_mismatch = 0, checked = 0;
  for (int m = 0; m < rows; ++m)
    for (int64_t j : {int64_t{0}, c.vocab / 3, c.vocab - 1, int64_t{a.tokens()[static_cast<std::size_t>(m)]}}) {
      double s = 0;
      for (int64_t k = 0; k < c.hidden; ++k)
        s += static_cast<double>(bf16::to_float(head_in[static_cast<std::size_t>(m * c.hidden + k)])) *
             bf16::to_float(lm[static_cast<std::size_t>(j * c.hidden + k)]);
      logit_mismatch += bf16::from_float(static_cast<float>(s)) != logits[static_cast<std::size_t>(m * c.vocab + j)];
      ++checked;
    }
  out.push_back({"lm_head by hand", logit_mismatch == 0, fmt::format("{} logits recomputed, {} differ", checked,
                                                                      logit_mismatch)});

  // The attention stand-in of the last layer, recomputed from its inputs (step.hpp).
  const std::vector<uint16_t>& q = ref.buffer(Buf::kQ);
  const std::vector<uint16_t>& kv = ref.buffer(Buf::kKv);
  const std::vector<uint16_t>& qkv_a = ref.buffer(Buf::kQkvA);
  const std::vector<uint16_t>& attn = ref.buffer(Buf::kAttn);
  const auto fq = [&](const std::vector<uint16_t>& b, int64_t cols, int64_t m, int64_t c) {
    return bf16::to_float(b[static_cast<std::size_t>(m * cols + c)]);
  };
  int attn_mismatch = 0;
  for (int m = 0; m < rows; ++m)
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t qh = h * c.qk_head();
      float s = 0.0f;
      for (int64_t r = 0; r < c.rope; ++r)
        s = std::fma(fq(q, c.heads * c.qk_head(), m, qh + c.nope + r), fq(qkv_a, c.qkv_a(), m, c.q_lora + c.kv_lora + r), s);
      for (int64_t d = 0; d < c.v_head; ++d) {
        const float v = std::fma(fq(q, c.heads * c.qk_head(), m, qh + d),
                                 fq(kv, c.kv_lora, m, (h * c.v_head + d) % c.kv_lora), s / 8.0f);
        attn_mismatch += bf16::from_float(v) != attn[static_cast<std::size_t>(m * c.heads * c.v_head + h * c.v_head + d)];
      }
    }
  out.push_back({"attention", attn_mismatch == 0,
                 fmt::format("{} stand-in outputs recomputed, {} differ", rows * c.heads * c.v_head, attn_mismatch)});

  // The context projection was added to the final hidden: head_in = BF16(hidden + context).
  const std::vector<uint16_t>& ctx = ref.buffer(Buf::kContext);
  bool add_ok = true;
  for (std::size_t i = 0; i < head_in.size(); ++i)
    add_ok &= head_in[i] == bf16::from_float(bf16::to_float(hidden[i]) + bf16::to_float(ctx[i]));
  out.push_back({"context add", add_ok, "head_in = BF16(final hidden + gathered context)"});

  const StepOpCounts full = count_step_ops(DrafterConfig::reference(), 8);
  out.push_back({"op sequence", full.ar_norms == 11 && full.gathers == 2 && full.gemms == 27,
                 fmt::format("reference shapes at TP 8: {} all-reduces, {} gathers, {} GEMMs", full.ar_norms,
                             full.gathers, full.gemms)});

  bool tiles = true;
  for (int tp : {2, 4, 8})
    for (Tensor t : {Tensor::kEmbedding, Tensor::kQkvA, Tensor::kQB, Tensor::kOProj, Tensor::kGateUp, Tensor::kDown,
                     Tensor::kContextProj, Tensor::kLmHead})
      tiles &= shards_tile_weight(c, {t, 0}, tp);
  out.push_back({"sharding", tiles, "every linear's shards at TP 2, 4, 8 tile its TP 1 weight"});
  return out;
}

}  // namespace tpdecode::drafter
