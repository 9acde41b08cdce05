#include "tpdecode/gemm_tactic.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

// The model's constants, fitted to `tpdecode bench gemm --split 1|2|4|8` on an H200
// (docs/performance.md): the rule's split is the fastest in 19 of the 20 measured
// (shape, M <= 8) cases and 1.3 % slower than the best in the other.
constexpr double kHbmBytesPerUs = 4.0e6;  // what the engine streams at best
constexpr double kLoadedLatencyUs = 2.5;  // a copy's round trip under load (Little's law)
constexpr double kLaunchUs = 1.0;         // launch, ring fill and drain
constexpr int kSmemPerSm = 228 * 1024;
constexpr int kSmemReservedPerCta = 1024;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Why: a cluster rank with fewer than two chunks would add a reduction step for
// almost no stream.
bool split_legal(int64_t k, int split) { return split == 1 || k / kWarpChunkK >= 2 * static_cast<int64_t>(split); }

GemmTactic model(int64_t n, int64_t k, int m, int sms, int split) {
  GemmTactic t;
  t.token_tiles = warp_token_tiles(m);
  t.split = split;
  t.blocks = ceil_div(n, kWarpCtaRows);
  t.ctas = t.blocks * split;
  const int64_t depth = std::min<int64_t>(kWarpStages, k / kWarpChunkK / split);
  const int64_t slots = int64_t{sms} * warp_ctas_per_sm(t.token_tiles);
  const double in_flight = static_cast<double>(std::min(t.ctas, slots) * depth * kWarpWarps * kWarpStageBytes);
  const double rate = std::min(kHbmBytesPerUs, in_flight / kLoadedLatencyUs);  // bytes per us
  const double rounds = static_cast<double>(t.ctas) / static_cast<double>(slots);
  const double quantization = rounds > 1 ? std::ceil(rounds) / rounds : 1.0;  // a partial last round
  t.predicted_us = kLaunchUs + 2.0 * static_cast<double>(n) * static_cast<double>(k) / rate * quantization;
  // Where the engine was measured clearly ahead of cuBLAS (1.10-1.14x, fused_qkv_a):
  // one token tile, at most half as many 64-row blocks as SMs (cuBLAS leaves SMs
  // idle; the cluster K split fills them) and 4096 <= K <= 8192. At 72 blocks (TP8
  // gate_up) the two were within 1 % either way, so cuBLAS keeps it.
  t.engine_preferred = m <= 8 && 2 * t.blocks <= sms && k >= 4096 && k <= 8192;
  return t;
}

}  // namespace

bool warp_eligible(int64_t n, int64_t k) {
  if (n <= 0 || k <= 0 || n % 16 || k % 128) return false;
  return k / 128 <= 64 || (k % 256 == 0 && k / 256 <= 64);
}

bool warp_weight_ok(const TensorView& weight) {
  return weight.data != nullptr && weight.dtype == DType::kBF16 && weight.contiguous() && weight.aligned(16) &&
         warp_eligible(weight.rows, weight.cols) && (weight.rows + kWarpCtaRows - 1) / kWarpCtaRows <= 65535;
}

// Why: the engine reads x in 16-byte pieces of contiguous rows; it writes out one
// element at a time, so any row stride of out is fine.
bool warp_activations_ok(const TensorView& x) {
  return x.data != nullptr && x.dtype == DType::kBF16 && x.rows >= 1 && x.rows <= kWarpMaxRows && x.contiguous() &&
         x.aligned(16);
}

int warp_token_tiles(int m) {
  require(m >= 1 && m <= kWarpMaxRows, fmt::format("warp split-K: {} rows (1..{})", m, kWarpMaxRows));
  return m <= 8 ? 1 : m <= 16 ? 2 : 4;
}

int warp_smem_bytes(int token_tiles) {
  const int ring_w = kWarpStages * kWarpWarps * kWarpStageBytes;    // [stages, warps, 8 pieces, 32 lanes] x 16 B
  const int ring_x = kWarpStages * 8 * token_tiles * kWarpChunkK * 2;  // [stages, 4, tokens, 4] x 16 B
  const int partials = 8 * token_tiles * kWarpCtaRows * 4;          // [tokens, 64] f32
  return ring_w + ring_x + partials;
}

int warp_ctas_per_sm(int token_tiles) { return kSmemPerSm / (warp_smem_bytes(token_tiles) + kSmemReservedPerCta); }

GemmTactic tactic_with_split(int64_t n, int64_t k, int m, int sms, int split) {
  require(warp_eligible(n, k), fmt::format("warp split-K: shape {}x{} is not eligible", n, k));
  require(sms >= 1, "warp split-K: no SMs");
  require((split == 1 || split == 2 || split == 4 || split == 8) && split_legal(k, split),
          fmt::format("warp split-K: split {} for K {}", split, k));
  return model(n, k, m, sms, split);
}

GemmTactic choose_tactic(int64_t n, int64_t k, int m, int sms) {
  GemmTactic best = tactic_with_split(n, k, m, sms, 1);
  for (int split = 2; split <= 8 && split_legal(k, split); split *= 2) {
    const GemmTactic t = model(n, k, m, sms, split);
    if (t.predicted_us < 0.98 * best.predicted_us) best = t;
  }
  return best;
}

std::string GemmTactic::describe() const {
  return fmt::format("{} blocks x split {}, {} token tile{}{}", blocks, split, token_tiles, token_tiles > 1 ? "s" : "",
                     engine_preferred ? "" : " (rule: cuBLAS)");
}

}  // namespace tpdecode
