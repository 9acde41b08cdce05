#include "tpdecode/gemm_tactic.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

constexpr double kHbmBytesPerUs = 4.3e6;   // read ceiling measured on H200 (DESIGN.md section 2)
constexpr double kLoadedLatencyUs = 2.0;   // one copy's round trip under a saturated HBM
constexpr double kReduceUsPerDoubling = 0.25;
constexpr int kSmemPerSm = 228 * 1024;
constexpr int kSmemReservedPerCta = 1024;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Why: a cluster rank whose warps have no chunk would only add a reduction step;
// without a split, idle warps (K < 512) simply contribute zeros.
bool split_legal(int64_t k, int split) {
  return split == 1 || k / kWarpChunkK >= static_cast<int64_t>(split) * kWarpWarps;
}

GemmTactic model(int64_t n, int64_t k, int m, int sms, int split) {
  GemmTactic t;
  t.token_tiles = warp_token_tiles(m);
  t.split = split;
  t.tiles = n / 16;
  t.ctas = t.tiles * split;
  const int64_t chunks_per_warp = std::max<int64_t>(1, k / kWarpChunkK / (int64_t{split} * kWarpWarps));
  const int64_t depth = std::min<int64_t>(kWarpStages - 1, chunks_per_warp);
  const int64_t per_sm = ceil_div(t.ctas, sms);
  const int64_t resident = std::min<int64_t>(warp_ctas_per_sm(t.token_tiles), per_sm);
  const double cta_bytes = 16.0 * static_cast<double>(k / split) * 2.0;
  const double in_flight = static_cast<double>(resident * kWarpWarps * depth * kWarpStageBytes);
  const double sm_us = static_cast<double>(per_sm) * cta_bytes / (in_flight / kLoadedLatencyUs);
  const double hbm_us = static_cast<double>(n) * static_cast<double>(k) * 2.0 / kHbmBytesPerUs;
  int doublings = 0;
  for (int s = split; s > 1; s /= 2) ++doublings;
  t.predicted_us = std::max(hbm_us, sm_us) + kReduceUsPerDoubling * doublings;
  return t;
}

}  // namespace

bool warp_eligible(int64_t n, int64_t k) {
  if (n <= 0 || k <= 0 || n % 16 || k % 128) return false;
  return k / 128 <= 64 || (k % 256 == 0 && k / 256 <= 64);
}

bool warp_weight_ok(const TensorView& weight) {
  return weight.data != nullptr && weight.dtype == DType::kBF16 && weight.contiguous() && weight.aligned(16) &&
         warp_eligible(weight.rows, weight.cols) && weight.rows / 16 <= 65535;
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
  const int ring = kWarpWarps * kWarpStages * kWarpStageBytes;       // [warps, stages, 8 pieces, 32 lanes] x 16 B
  const int partials = kWarpWarps * 16 * 8 * token_tiles * 4;        // [warps, 16, 8 * tiles] f32
  return ring + partials;
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
  return fmt::format("tiles {} x split {}, {} token tile{}", tiles, split, token_tiles, token_tiles > 1 ? "s" : "");
}

}  // namespace tpdecode
