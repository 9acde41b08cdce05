// What DecodeGemm decided for a shape, as an engine sees it: the path, where the
// decision came from, its launch parameters (so a team can broadcast it and a tool
// can force it), and the M buckets decisions are made for. The engines' launch
// shapes, eligibility and static rule are private to the library.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace tpdecode {

// ---- Paths and the decision record --------------------------------------------
enum class GemmPath : uint8_t {
  kWarpSplitK,  // the warp split-K engine (mma.sync)
  kCublas,      // cublasGemmEx with cuBLAS's default algorithm (the stock path)
  kCublasLt,    // cublasLtMatmul with an algorithm the tuner measured
  kWgmma,       // the wgmma engine (TMA tiles, warpgroup MMA, up to 64 rows)
  kWgmmaWide,   // the wgmma engine's wide form: 128-256 weight rows as the MMA's N, 17-64 rows
};
const char* gemm_path_name(GemmPath p);  // "warp", "cublas", "cublaslt", "wgmma", "wgmma-wide"

// Where a decision came from.
enum class GemmSource : uint8_t { kRule, kTuned, kCache, kAgreed, kForced };
const char* gemm_source_name(GemmSource s);  // "rule", "tuned", "cache", "agreed", "forced"

// The bytes of a cublasLtMatmulAlgo_t (opaque here; the library reads them).
using CublasLtAlgo = std::array<uint64_t, 8>;

// What DecodeGemm runs for one (GPU, N, K, M bucket): trivially copyable (a team
// broadcasts it between ranks) and small.
struct GemmDecision {
  GemmPath path = GemmPath::kCublas;
  GemmSource source = GemmSource::kRule;
  uint8_t split = 1;        // kWarpSplitK, kWgmma(Wide): CTAs per cluster (1 .. 8), each a K range
  uint8_t sub_tiles = 0;    // kWgmma: 64-row tiles per row block (1, 2, 4); kWgmmaWide: a block's rows / 8
                            // (16 .. 32); kWarpSplitK: 16-row tiles
                            // per CTA (4: one per warp; 1: the warps split the CTA's K range)
  uint8_t stages = 0;       // kWgmma(Wide): ring stages; kWarpSplitK: 0, or the one-tile CTA's
                            // tensor-map ring (its second form)
  uint16_t clusters = 0;    // kWgmma(Wide): clusters launched (0: as many as fit, at most one per row block)
  float measured_us = 0;    // the tuner's median time per call (0: not measured)
  float tune_ms = 0;        // what deciding cost (both phases of timing)
  uint8_t tune_finalists = 0;  // candidates re-timed in phase 2 (1: phase 1 decided alone; 0: not tuned)
  uint8_t tune_rounds = 0;     // phase-2 rounds run
  bool tune_stable = false;    // the decision held for the last two rounds (or had no rival within 5 %)
  CublasLtAlgo lt_algo{};   // kCublasLt
  // The same kernel and launch shape (source and times aside): bitwise the same result.
  bool same_path(const GemmDecision& o) const {
    return path == o.path && split == o.split && sub_tiles == o.sub_tiles && stages == o.stages &&
           clusters == o.clusters && lt_algo == o.lt_algo;
  }
};
// e.g. "warp split 8", "wgmma split 4 x 128 rows, 11 stages", "cublaslt #3fa9c1"
std::string describe(const GemmDecision& d);
// Decisions to force (DecodeGemm::force) or compare with.
GemmDecision warp_decision(int split, int row_tiles = 4, bool tensor_map = false);
GemmDecision wgmma_decision(int split, int sub_tiles, int stages, int clusters = 0);
GemmDecision wgmma_wide_decision(int split, int rows, int stages, int clusters = 0);  // rows: 128 .. 256
GemmDecision cublas_decision();

// What the weight allows (set by DecodeGemm from the operands).
struct GemmEngines {
  bool warp = false;   // the warp split-K engine can run this weight
  bool wgmma = false;  // the wgmma engine can
};

// ---- M buckets -------------------------------------------------------------------
// Most rows DecodeGemm's engines take in one call; more rows always run cuBLAS.
inline constexpr int kGemmMaxRows = 64;
// Decisions are made per bucket of row counts: 1, 2, 3-4, 5-8, 9-12, 13-16, 17-20,
// 21-24, 25-28, 29-32, 33-40, 41-48, 49-56, 57-64. A bucket never straddles the
// engines' token tiles (8, 16, 32, 64 rows).
inline constexpr int kGemmBuckets = 14;
int gemm_m_bucket(int m);         // 1 <= m <= kGemmMaxRows
int gemm_bucket_min(int bucket);
int gemm_bucket_max(int bucket);  // the row count the tuner times

}  // namespace tpdecode
