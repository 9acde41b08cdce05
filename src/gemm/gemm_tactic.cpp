#include "gemm/gemm_tactic.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "core/check.hpp"
#include "gemm/wgmma_plan.hpp"
#include "core/hash.hpp"

namespace tpdecode {
namespace {

// The model's constants, fitted to `tpdecode bench gemm` on an H200 (every split and
// cuBLAS forced, 37 shapes at M 1, 8 and 16, two runs: docs/history/
// performance-2026-11.md, "The static rule, refit"): its choices take 1.01 x the
// time of the best path offline, 1.014 x on a GPU (docs/performance.md, "DecodeGemm").
constexpr double kPeakBytesPerUs = 4.0e6;   // what the engine streams at best
constexpr double kCtaBytesPerUs = 12.0e3;   // what one CTA's ring streams below that
constexpr double kTwoTileRate = 0.7;        // a CTA's rate with 2 or 4 token tiles (more MMA, x)
constexpr double kRoundUs = 0.5;            // ramp and drain of each round of clusters
constexpr double kLaunchUs = 1.0;
constexpr double kCublasUs = 5.0;           // cuBLAS (default algorithm): fixed cost ...
constexpr double kCublasBytesPerUs = 3.8e6;  // ... and streaming rate
constexpr int kEngineMaxRows = 16;          // above, cuBLAS (the engine was measured behind it)

// Clusters of the engine one 132-SM H100 / H200 holds at once, per split 1..8, at 3
// and at 2 CTAs per SM (1 token tile; 2 or 4), measured with
// cudaOccupancyMaxActiveClusters: a cluster's CTAs share one GPC, so fewer clusters
// fit than slots / split. Other SM counts scale them.
constexpr std::array<int, kWarpMaxSplit> kResidentAt3PerSm = {396, 198, 124, 92, 69, 62, 47, 45};
constexpr std::array<int, kWarpMaxSplit> kResidentAt2PerSm = {264, 132, 79, 62, 47, 39, 32, 30};
constexpr int kTableSms = 132;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A CTA shape of `row_tiles` 16-row tiles runs N rows in at most 65535 blocks (the
// grid's y limit).
bool warp_blocks_fit(int64_t n, int row_tiles) { return ceil_div(n, 16 * int64_t{row_tiles}) <= 65535; }

// Why: a cluster rank with fewer than two chunks would add a reduction step for
// almost no stream.
bool split_legal(int64_t k, int split) { return split == 1 || k / kWarpChunkK >= 2 * static_cast<int64_t>(split); }

// Clusters of `split` CTAs resident at once where an SM holds `per_sm` of them.
int64_t resident_clusters(int per_sm, int split, int sms) {
  const auto& table = per_sm >= 3 ? kResidentAt3PerSm : kResidentAt2PerSm;
  return std::max<int64_t>(1, int64_t{table[static_cast<std::size_t>(split - 1)]} * sms / kTableSms);
}

GemmTactic model(int64_t n, int64_t k, int m, int sms, int split) {
  GemmTactic t = warp_launch_tactic(n, k, m, split);
  // Rounds of resident clusters; in each, HBM is shared by its CTAs, each streaming
  // at most kCtaBytesPerUs.
  const int64_t resident = resident_clusters(warp_ctas_per_sm(t.token_tiles), split, sms);
  const double cta_rate = kCtaBytesPerUs * (t.token_tiles == 1 ? 1.0 : kTwoTileRate);
  double us = kLaunchUs;
  for (int64_t left = t.blocks; left > 0;) {
    const int64_t clusters = std::min(left, resident);
    left -= clusters;
    const double bytes = static_cast<double>(clusters * kWarpCtaRows) * static_cast<double>(k) * 2.0;
    us += bytes / std::min(kPeakBytesPerUs, static_cast<double>(clusters * split) * cta_rate) + kRoundUs;
  }
  t.predicted_us = us;
  const double cublas_us = kCublasUs + 2.0 * static_cast<double>(n) * static_cast<double>(k) / kCublasBytesPerUs;
  t.engine_preferred = m <= kEngineMaxRows && t.predicted_us <= cublas_us;
  return t;
}

}  // namespace

bool warp_split_ok(int64_t k, int split) { return split >= 1 && split <= kWarpMaxSplit && split_legal(k, split); }

bool warp_split_for_shared_gpu(int split) { return split == 1 || split == 2 || split == 4 || split == 8; }

bool warp_eligible(int64_t n, int64_t k) {
  return n > 0 && k > 0 && n % 16 == 0 && k % kWarpChunkK == 0 && n <= (int64_t{1} << 40) / k;
}

bool warp_weight_ok(const TensorView& weight) {
  return weight.data != nullptr && weight.dtype == DType::kBF16 && weight.contiguous() && weight.aligned(16) &&
         warp_eligible(weight.rows, weight.cols) && warp_blocks_fit(weight.rows, kWarpWarps);
}

int warp_token_tiles(int m) {
  check(m >= 1 && m <= kWarpMaxRows, "decode gemm engines: {} rows (1..{})", m, kWarpMaxRows);
  return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8;
}

int warp_smem_bytes(int token_tiles, int row_tiles, bool tensor_map) {
  const int k_groups = kWarpWarps / row_tiles;  // warps that each copy their own x slices
  if (tensor_map) return 1024 + narrow_tma_ring_bytes(token_tiles) + k_groups * 8 * token_tiles * 16 * 4;
  const int ring_w = kWarpStages * kWarpWarps * kWarpStageBytes;    // [stages, warps, 8 pieces, 32 lanes] x 16 B
  const int ring_x = k_groups * kWarpStages * 8 * token_tiles * kWarpChunkK * 2;  // [groups, stages, 4, tokens, 4] x 16 B
  const int partials = k_groups * 8 * token_tiles * 16 * row_tiles * 4;  // [groups, tokens, CTA rows] f32
  return ring_w + ring_x + partials;
}

int warp_ctas_per_sm(int token_tiles, int row_tiles, bool tensor_map) {
  return kSmemPerSm / (warp_smem_bytes(token_tiles, row_tiles, tensor_map) + kSmemReservedPerCta);
}

bool warp_tensor_map(const GemmDecision& d) { return d.path == GemmPath::kWarpSplitK && d.stages != 0; }

bool warp_tensor_map_ok(int64_t n, int64_t k) { return warp_eligible(n, k) && wgmma_eligible(n, k); }

bool warp_row_tiles_ok(int row_tiles, int m) {
  return row_tiles == kWarpWarps || ((row_tiles == 1 || row_tiles == 2) && m <= kWarpNarrowMaxRows);
}

int warp_launch_rows(int row_tiles, int m) { return row_tiles < kWarpWarps ? std::min(m, kWarpNarrowMaxRows) : m; }

int narrow_invariant_split(int64_t n, int64_t k, int sms, bool powers_of_two) {
  const int64_t blocks = ceil_div(n, 16);
  const int per_sm = warp_ctas_per_sm(1, 1, warp_tensor_map_ok(n, k));
  int best = 0;
  for (int split = 1; split <= kWarpMaxSplit && split_legal(k, split); ++split) {
    if (powers_of_two && !warp_split_for_shared_gpu(split)) continue;
    if (blocks <= resident_clusters(per_sm, split, sms) && blocks * split >= sms) best = split;
  }
  return best;
}

GemmTactic warp_launch_tactic(int64_t n, int64_t k, int m, int split, int row_tiles, bool tensor_map) {
  check(warp_eligible(n, k), "warp split-K: shape {}x{} is not eligible", n, k);
  check(warp_split_ok(k, split), "warp split-K: split {} for K {}", split, k);
  check(warp_row_tiles_ok(row_tiles, m), "warp split-K: {} row tiles per CTA at {} rows", row_tiles, m);
  check(!tensor_map || (row_tiles == 1 && warp_tensor_map_ok(n, k)),
        "warp split-K: the tensor-map form is a one-tile CTA's (shape {}x{}, {} row tiles)", n, k, row_tiles);
  GemmTactic t;
  t.token_tiles = warp_token_tiles(m);
  t.split = split;
  t.row_tiles = row_tiles;
  t.tensor_map = tensor_map;
  t.blocks = ceil_div(n, 16 * row_tiles);
  t.ctas = t.blocks * split;
  return t;
}

GemmTactic tactic_with_split(int64_t n, int64_t k, int m, int sms, int split) {
  check(sms >= 1, "warp split-K: no SMs");
  check(m >= 1 && m <= kWarpCandidateMaxRows, "warp split-K rule: {} rows (1..{})", m, kWarpCandidateMaxRows);
  return model(n, k, m, sms, split);  // the shape and split checked by warp_launch_tactic
}

GemmTactic choose_tactic(int64_t n, int64_t k, int m, int sms, bool powers_of_two) {
  GemmTactic best = tactic_with_split(n, k, m, sms, 1);
  for (int split = 2; split <= kWarpMaxSplit && split_legal(k, split); ++split) {
    if (powers_of_two && !warp_split_for_shared_gpu(split)) continue;
    const GemmTactic t = model(n, k, m, sms, split);
    if (t.predicted_us < 0.98 * best.predicted_us) best = t;
  }
  return best;
}

std::string GemmTactic::describe() const {
  const std::string rows = row_tiles < kWarpWarps ? fmt::format(" of {} rows", 16 * row_tiles) : "";
  return fmt::format("{} blocks{} x split {}, {} token tile{}{}", blocks, rows, split, token_tiles,
                     token_tiles > 1 ? "s" : "", tensor_map ? ", tensor maps" : "");
}

// ---- Decisions and buckets ------------------------------------------------------

const char* gemm_path_name(GemmPath p) {
  switch (p) {
    case GemmPath::kWarpSplitK: return "warp";
    case GemmPath::kCublas: return "cublas";
    case GemmPath::kCublasLt: return "cublaslt";
    case GemmPath::kWgmma: return "wgmma";
    case GemmPath::kWgmmaWide: return "wgmma-wide";
  }
  return "?";
}

const char* gemm_source_name(GemmSource s) {
  switch (s) {
    case GemmSource::kRule: return "rule";
    case GemmSource::kTuned: return "tuned";
    case GemmSource::kCache: return "cache";
    case GemmSource::kAgreed: return "agreed";
    case GemmSource::kForced: return "forced";
  }
  return "?";
}

std::string describe(const GemmDecision& d) {
  switch (d.path) {
    case GemmPath::kWarpSplitK:
      return fmt::format("warp split {}{}{}", int{d.split},
                         d.sub_tiles < kWarpWarps ? fmt::format(", {}-row CTAs", 16 * d.sub_tiles) : "",
                         warp_tensor_map(d) ? ", tensor maps" : "");
    case GemmPath::kWgmma:
    case GemmPath::kWgmmaWide:
      return fmt::format("{} split {} x {} rows, {} stages{}", gemm_path_name(d.path), int{d.split},
                         (d.path == GemmPath::kWgmmaWide ? 8 : 64) * int{d.sub_tiles}, int{d.stages},
                         d.clusters ? fmt::format(", {} clusters", int{d.clusters}) : std::string());
    case GemmPath::kCublasLt: {
      uint64_t h = 0;  // a short name for the algorithm's bytes
      for (uint64_t word : d.lt_algo) h = hash::mix64(h ^ word);
      return fmt::format("cublaslt #{:06x}", h & 0xffffff);
    }
    case GemmPath::kCublas: break;
  }
  return "cublas";
}

GemmDecision warp_decision(int split, int row_tiles, bool tensor_map) {
  GemmDecision d;
  d.path = GemmPath::kWarpSplitK;
  d.split = static_cast<uint8_t>(split);
  d.sub_tiles = static_cast<uint8_t>(row_tiles);
  d.stages = tensor_map ? kNarrowTmaStages : 0;
  return d;
}

GemmDecision wgmma_decision(int split, int sub_tiles, int stages, int clusters) {
  GemmDecision d;
  d.path = GemmPath::kWgmma;
  d.split = static_cast<uint8_t>(split);
  d.sub_tiles = static_cast<uint8_t>(sub_tiles);
  d.stages = static_cast<uint8_t>(stages);
  d.clusters = static_cast<uint16_t>(clusters);
  return d;
}

GemmDecision wgmma_wide_decision(int split, int rows, int stages, int clusters) {
  GemmDecision d = wgmma_decision(split, rows / 8, stages, clusters);
  d.path = GemmPath::kWgmmaWide;
  return d;
}

GemmDecision cublas_decision() { return GemmDecision{}; }

namespace {
// [edge, next). Four rows wide from 9 to 32 and eight above: cuBLASLt's algorithms and
// cuBLAS's default change speed inside a token tile (TP 4 gate_up 9216 x 7168: cuBLAS's
// default timed at 32 rows ran 1.15 x cuBLASLt's best at 28), and a bucket is timed at
// its most rows, which the drafter's row counts (R x 7) then hit or lie near.
constexpr std::array<int, kGemmBuckets + 1> kBucketEdges = {1, 2, 3, 5, 9, 13, 17, 21, 25, 29, 33, 41, 49, 57, 65};
}  // namespace

int gemm_m_bucket(int m) {
  check(m >= 1 && m <= kGemmMaxRows, "decode gemm: no bucket for {} rows (1..{})", m, kGemmMaxRows);
  return static_cast<int>(std::upper_bound(kBucketEdges.begin(), kBucketEdges.end(), m) - kBucketEdges.begin()) - 1;
}

int gemm_bucket_min(int bucket) {
  check(bucket >= 0 && bucket < kGemmBuckets, "decode gemm: bucket {}", bucket);
  return kBucketEdges[bucket];
}

int gemm_bucket_max(int bucket) {
  check(bucket >= 0 && bucket < kGemmBuckets, "decode gemm: bucket {}", bucket);
  return kBucketEdges[bucket + 1] - 1;
}

// ---- Candidates and the static rule -------------------------------------------

bool wgmma_eligible(int64_t n, int64_t k) {
  return n > 0 && k > 0 && k % wgmma::kChunkK == 0 && n < (int64_t{1} << 31) && k < (int64_t{1} << 31) &&
         n <= (int64_t{1} << 40) / k;
}

bool wgmma_weight_ok(const TensorView& weight) {
  return weight.data != nullptr && weight.dtype == DType::kBF16 && weight.contiguous() && weight.aligned(16) &&
         wgmma_eligible(weight.rows, weight.cols);
}

bool engine_activations_ok(const TensorView& x) {
  return x.data != nullptr && x.dtype == DType::kBF16 && x.rows >= 1 && x.rows <= kGemmMaxRows && x.contiguous() &&
         x.aligned(16);
}

bool wgmma_split_ok(int64_t k, int split) {
  return split >= 1 && split <= kWarpMaxSplit && (split == 1 || k / wgmma::kChunkK >= 2 * int64_t{split});
}

std::vector<GemmDecision> wgmma_candidates(int64_t n, int64_t k, int m) {
  std::vector<GemmDecision> out;
  if (!wgmma_eligible(n, k) || m < 1 || m > kGemmMaxRows) return out;
  const int tokens = wgmma::token_tile(m);
  for (int sub : {1, 2, 4}) {
    if (!wgmma::shape_built(sub, tokens)) continue;
    for (int budget : {kWgmmaHalfBudget, kWgmmaFullBudget}) {
      const int stages = wgmma::stages_within(sub, tokens, budget);
      if (stages == 0) continue;
      for (int split = 1; split <= kWarpMaxSplit; ++split)
        if (wgmma_split_ok(k, split)) out.push_back(wgmma_decision(split, sub, stages));
    }
  }
  return out;
}

std::vector<GemmDecision> wgmma_wide_candidates(int64_t n, int64_t k, int m, int sms) {
  std::vector<GemmDecision> out;
  if (!wgmma_eligible(n, k) || m <= kWideMinRows || m > kGemmMaxRows) return out;
  for (int rows : wgmma::kWideRows) {
    const int64_t blocks = (n + rows - 1) / rows;
    std::vector<int> splits;
    int fullest = 0;  // the legal split of the most CTAs in one wave
    for (int split = 1; split <= kWarpMaxSplit; ++split) {
      if (!wgmma_split_ok(k, split) || wgmma::wide_stages_within(rows, split, kWgmmaFullBudget) == 0) continue;
      const int64_t ctas = blocks * split;
      if (sms <= 0 || (ctas <= sms && 10 * ctas >= 7 * int64_t{sms}) || (split == 1 && ctas > sms))
        splits.push_back(split);
      if (ctas <= sms) fullest = split;
    }
    if (splits.empty() && fullest > 0) splits.push_back(fullest);
    for (int split : splits)
      out.push_back(wgmma_wide_decision(split, rows, wgmma::wide_stages_within(rows, split, kWgmmaFullBudget)));
  }
  return out;
}

int invariant_split(int64_t n, int64_t k, int sms, bool powers_of_two) {
  const int64_t blocks = (n + wgmma::kTileRows - 1) / wgmma::kTileRows;
  auto next = [&](int s) { return powers_of_two ? 2 * s : s + 1; };
  int split = 1;
  while (next(split) <= kWarpMaxSplit && blocks * split < sms && wgmma_split_ok(k, next(split))) split = next(split);
  return split;
}

GemmDecision invariant_decision(int64_t n, int64_t k, int m, int sms, GemmEngines engines, bool shared_gpu,
                                int rows) {
  check(m >= 1 && m <= kGemmMaxRows && rows >= 1 && rows <= kGemmMaxRows && sms >= 1,
        "batch-invariant decode gemm: {} rows (for {}), {} SMs", m, rows, sms);
  const bool warp = engines.warp && warp_eligible(n, k);
  const bool wgmma = engines.wgmma && wgmma_eligible(n, k);
  check(warp || wgmma, "batch-invariant decode gemm: neither engine takes a {}x{} weight", n, k);
  const GemmTactic t = warp ? choose_tactic(n, k, std::min(rows, kWarpCandidateMaxRows), sms, shared_gpu) : GemmTactic{};
  const int narrow = warp && !t.engine_preferred && rows <= 8 ? narrow_invariant_split(n, k, sms, shared_gpu) : 0;
  GemmDecision d = narrow > 0                               ? warp_decision(narrow, 1, warp_tensor_map_ok(n, k))
                   : warp && (t.engine_preferred || !wgmma) ? warp_decision(t.split)
                                                            : wgmma_decision(invariant_split(n, k, sms, shared_gpu), 1, 0);
  d.source = GemmSource::kRule;
  return invariant_member(d, m);
}

GemmDecision invariant_member(const GemmDecision& order, int m) {
  if (order.path != GemmPath::kWgmma) return order;
  // Why the full-SM ring at 64 tokens: the half-SM one holds 4 stages there, and
  // 11 measured faster on every TP 8 shape at M 64 (lm_head 110.8 against 132.0 us;
  // docs/performance.md). Neither the ring nor the tiles change the bits.
  const int tokens = wgmma::token_tile(m);
  const int budget = tokens == 64 ? kWgmmaFullBudget : kWgmmaHalfBudget;
  GemmDecision d = order;
  const int sub = order.sub_tiles;
  if (!wgmma::shape_built(sub, tokens) || wgmma::stages_within(sub, tokens, budget) == 0) d.sub_tiles = 1;
  d.stages = static_cast<uint8_t>(wgmma::stages_within(d.sub_tiles, tokens, budget));
  d.clusters = 0;
  return d;
}

bool same_summation_order(const GemmDecision& a, const GemmDecision& b) {
  if (a.path != b.path || a.split != b.split) return false;
  return a.path == GemmPath::kWgmma || a.path == GemmPath::kWgmmaWide ||
         (a.path == GemmPath::kWarpSplitK && a.sub_tiles == b.sub_tiles && a.stages == b.stages);
}

namespace {
// The warp decisions of one CTA shape and split: the cp.async form, and for the
// one-tile CTA the tensor-map form where the weight has a map.
void push_warp_forms(std::vector<GemmDecision>& out, int64_t n, int64_t k, int split, int row_tiles) {
  out.push_back(warp_decision(split, row_tiles));
  if (row_tiles == 1 && warp_tensor_map_ok(n, k)) out.push_back(warp_decision(split, row_tiles, true));
}
}  // namespace

std::vector<GemmDecision> invariant_candidates(int64_t n, int64_t k, int m, GemmEngines engines, bool shared_gpu) {
  std::vector<GemmDecision> out;
  auto split_ok = [&](int split) { return !shared_gpu || warp_split_for_shared_gpu(split); };
  if (engines.warp && warp_eligible(n, k))
    for (int row_tiles : kWarpRowTileChoices)
      if (warp_blocks_fit(n, row_tiles))
        for (int split = 1; split <= kWarpMaxSplit; ++split)
          if (warp_split_ok(k, split) && split_ok(split)) push_warp_forms(out, n, k, split, row_tiles);
  if (engines.wgmma)
    for (const GemmDecision& d : wgmma_candidates(n, k, m))
      if (split_ok(d.split)) out.push_back(d);
  for (GemmDecision& d : out) d.source = GemmSource::kTuned;
  return out;
}

std::vector<GemmDecision> engine_candidates(int64_t n, int64_t k, int m, GemmEngines engines, int sms) {
  std::vector<GemmDecision> out;
  if (engines.warp && warp_eligible(n, k) && m <= kWarpCandidateMaxRows)
    for (int row_tiles : kWarpRowTileChoices)
      if (warp_row_tiles_ok(row_tiles, m) && warp_blocks_fit(n, row_tiles))
        for (int split = 1; split <= kWarpMaxSplit; ++split)
          if (warp_split_ok(k, split)) push_warp_forms(out, n, k, split, row_tiles);
  if (engines.wgmma) {
    for (const GemmDecision& d : wgmma_candidates(n, k, m)) out.push_back(d);
    for (const GemmDecision& d : wgmma_wide_candidates(n, k, m, sms)) out.push_back(d);
  }
  out.push_back(cublas_decision());
  for (GemmDecision& d : out) d.source = GemmSource::kTuned;
  return out;
}

GemmDecision rule_decision(int64_t n, int64_t k, int m, int sms, GemmEngines engines, bool shared_gpu) {
  if (engines.warp && warp_eligible(n, k) && m <= kWarpCandidateMaxRows) {
    const GemmTactic t = choose_tactic(n, k, m, sms, shared_gpu);
    if (t.engine_preferred) return warp_decision(t.split);
  }
  return cublas_decision();
}

bool engine_decision_legal(const GemmDecision& d, int64_t n, int64_t k, int m, int sms, GemmEngines engines) {
  if (m < 1 || m > kGemmMaxRows || sms < 1) return d.path == GemmPath::kCublas;
  switch (d.path) {
    case GemmPath::kCublas:
    case GemmPath::kCublasLt: return true;
    case GemmPath::kWarpSplitK:
      // Why any row count for the narrow CTAs: they run them as launches of at most
      // kWarpNarrowMaxRows rows (warp_launch_rows).
      return engines.warp && warp_eligible(n, k) && m <= kWarpMaxRows && warp_split_ok(k, d.split) &&
             warp_row_tiles_ok(d.sub_tiles, warp_launch_rows(d.sub_tiles, m)) && warp_blocks_fit(n, d.sub_tiles) &&
             (d.stages == 0 || (d.stages == kNarrowTmaStages && d.sub_tiles == 1 && warp_tensor_map_ok(n, k)));
    case GemmPath::kWgmma: {
      const int tokens = wgmma::token_tile(m);
      const int64_t blocks = (n + 64 * int64_t{d.sub_tiles} - 1) / (64 * std::max<int64_t>(1, d.sub_tiles));
      return engines.wgmma && wgmma_eligible(n, k) && wgmma_split_ok(k, d.split) &&
             wgmma::shape_built(d.sub_tiles, tokens) && d.stages >= wgmma::kMinStages &&
             d.stages <= wgmma::kMaxStages &&
             wgmma::layout(d.sub_tiles, tokens, d.stages).smem_bytes <= kWgmmaFullBudget && d.clusters <= blocks;
    }
    case GemmPath::kWgmmaWide: {
      const int rows = 8 * d.sub_tiles;
      const int64_t blocks = (n + rows - 1) / std::max(1, rows);
      return engines.wgmma && wgmma_eligible(n, k) && wgmma_split_ok(k, d.split) && wgmma::wide_shape_built(rows) &&
             m > kWideMinRows && d.stages >= wgmma::kMinStages && d.stages <= wgmma::kMaxStages &&
             wgmma::wide_layout(rows, d.stages, d.split).smem_bytes <= kWgmmaFullBudget && d.clusters <= blocks;
    }
  }
  return false;
}

}  // namespace tpdecode
