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
  kWarpSplitK,  // the warp split-K engine
  kCublas,      // cublasGemmEx with cuBLAS's default algorithm (the stock path)
  kCublasLt,    // cublasLtMatmul with an algorithm the tuner measured
};
const char* gemm_path_name(GemmPath p);  // "warp", "cublas", "cublaslt"

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
  uint8_t split = 1;        // kWarpSplitK: CTAs per cluster (1 .. 8)
  float measured_us = 0;    // the tuner's median time per call (0: not measured)
  float tune_ms = 0;        // what deciding cost (timing every candidate)
  CublasLtAlgo lt_algo{};   // kCublasLt
  // The same kernel and launch shape (source and times aside): bitwise the same result.
  bool same_path(const GemmDecision& o) const {
    return path == o.path && split == o.split && lt_algo == o.lt_algo;
  }
};
std::string describe(const GemmDecision& d);  // e.g. "warp split 8", "cublaslt #3fa9c1"
// Decisions to force (DecodeGemm::force) or compare with.
GemmDecision warp_decision(int split);
GemmDecision cublas_decision();

// What the weight allows (set by DecodeGemm from the operands).
struct GemmEngines {
  bool warp = false;  // the warp split-K engine can run this weight
};

// ---- M buckets -------------------------------------------------------------------
// Decisions are made per bucket of row counts: 1, 2, 3-4, 5-8, 9-12, 13-16, 17-24,
// 25-32. A bucket never straddles the engines' token tiles (8, 16, 32 rows).
inline constexpr int kGemmBuckets = 8;
int gemm_m_bucket(int m);         // 1 <= m <= 32
int gemm_bucket_min(int bucket);
int gemm_bucket_max(int bucket);  // the row count the tuner times

}  // namespace tpdecode
