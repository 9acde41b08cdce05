#include "tpdecode/gemm_tactic.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

// The model's constants (docs/performance.md, "DecodeGemm").
constexpr double kHbmBytesPerUs = 4.0e6;  // what the engine streams at best
constexpr double kLoadedLatencyUs = 2.5;  // a copy's round trip under load (Little's law)
constexpr double kFixedUs = 2.0;          // launch, the x slice, the first ring fill and the last reduction
constexpr int kSmemPerSm = 228 * 1024;
constexpr int kSmemReservedPerCta = 1024;
constexpr int kStageChoices[] = {8, 6, 4};  // deepest first

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Why: a cluster rank with fewer than two chunks would add a reduction step for
// almost no stream.
bool split_legal(int64_t k, int split) { return split == 1 || k / kWarpChunkK >= 2 * static_cast<int64_t>(split); }

// The tactic for one (split, stages), or predicted_us < 0 where it cannot run.
GemmTactic model(int64_t n, int64_t k, int m, const ClusterResidency& residency, int split, int stages) {
  GemmTactic t;
  t.token_tiles = warp_token_tiles(m);
  t.split = split;
  t.stages = stages;
  t.blocks = ceil_div(n, kWarpCtaRows);
  t.chunks_per_rank = static_cast<int>(ceil_div(k / kWarpChunkK, split));
  t.smem_bytes = warp_smem_bytes(t.token_tiles, stages, t.chunks_per_rank);
  t.predicted_us = -1;
  if (t.smem_bytes > kWarpSmemLimit) return t;
  const int resident = residency(t.token_tiles, stages, split, t.smem_bytes);
  if (resident < 1) return t;
  t.clusters = std::min<int64_t>(t.blocks, resident);
  t.rounds = ceil_div(t.blocks, t.clusters);
  const double ring = static_cast<double>(stages) * kWarpWarps * kWarpStageBytes;
  const double cta_rate = std::min(ring / kLoadedLatencyUs, kHbmBytesPerUs / static_cast<double>(t.clusters * split));
  const double cta_bytes = static_cast<double>(t.rounds) * kWarpCtaRows * t.chunks_per_rank * kWarpChunkK * 2.0;
  t.predicted_us = kFixedUs + cta_bytes / cta_rate;
  t.engine_preferred = true;
  return t;
}

// The deepest ring that fits this split (predicted_us < 0 if none does).
GemmTactic deepest_ring(int64_t n, int64_t k, int m, const ClusterResidency& residency, int split) {
  GemmTactic t;
  for (int stages : kStageChoices) {
    t = model(n, k, m, residency, split, stages);
    if (t.predicted_us >= 0) return t;
  }
  return t;
}

}  // namespace

bool warp_eligible(int64_t n, int64_t k) {
  if (n <= 0 || k <= 0 || n % 16 || k % 128) return false;
  return k / 128 <= 64 || (k % 256 == 0 && k / 256 <= 64);
}

bool warp_weight_ok(const TensorView& weight) {
  return weight.data != nullptr && weight.dtype == DType::kBF16 && weight.contiguous() && weight.aligned(16) &&
         warp_eligible(weight.rows, weight.cols);
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

int warp_smem_bytes(int token_tiles, int stages, int chunks_per_rank) {
  const int tokens = 8 * token_tiles;
  const int ring_w = stages * kWarpWarps * kWarpStageBytes;
  const int partials = 2 * tokens * kWarpCtaRows * 4;
  const int x_slice = chunks_per_rank * tokens * kWarpChunkK * 2;
  return ring_w + partials + x_slice;
}

ClusterResidency uniform_residency(int sms) {
  return [sms](int, int, int split, int smem_bytes) {
    const int per_sm = kSmemPerSm / (smem_bytes + kSmemReservedPerCta);
    return sms * per_sm / split;
  };
}

GemmTactic tactic_with_split(int64_t n, int64_t k, int m, const ClusterResidency& residency, int split, int stages) {
  require(warp_eligible(n, k), fmt::format("warp split-K: shape {}x{} is not eligible", n, k));
  require((split == 1 || split == 2 || split == 4 || split == 8) && split_legal(k, split),
          fmt::format("warp split-K: split {} for K {}", split, k));
  require(stages == 0 || stages == 4 || stages == 6 || stages == 8,
          fmt::format("warp split-K: {} ring stages (4, 6 or 8)", stages));
  const GemmTactic t =
      stages ? model(n, k, m, residency, split, stages) : deepest_ring(n, k, m, residency, split);
  require(t.predicted_us >= 0, fmt::format("warp split-K: split {} with {} stages does not fit {}x{} at M {}", split,
                                           t.stages, n, k, m));
  return t;
}

GemmTactic choose_tactic(int64_t n, int64_t k, int m, const ClusterResidency& residency) {
  require(warp_eligible(n, k), fmt::format("warp split-K: shape {}x{} is not eligible", n, k));
  GemmTactic best;
  best.predicted_us = -1;
  for (int split = 1; split <= kWarpMaxSplit && split_legal(k, split); split *= 2) {
    const GemmTactic t = deepest_ring(n, k, m, residency, split);
    if (t.predicted_us < 0) continue;
    if (best.predicted_us < 0 || t.predicted_us < 0.98 * best.predicted_us) best = t;
  }
  if (best.predicted_us < 0) {  // nothing fits this GPU: the dispatch keeps cuBLAS
    best.clusters = 0;
    best.engine_preferred = false;
  }
  return best;
}

std::string GemmTactic::describe() const {
  if (!runnable()) return "no launch shape fits this GPU";
  return fmt::format("{} blocks on {} clusters x split {}, {} stages, {} token tile{}{}", blocks, clusters, split,
                     stages, token_tiles, token_tiles > 1 ? "s" : "", engine_preferred ? "" : " (rule: cuBLAS)");
}

}  // namespace tpdecode
