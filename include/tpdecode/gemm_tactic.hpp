// How DecodeGemm can run a shape: which shapes each engine takes, their launch
// shapes for (N, K, M, SM count), the M buckets decisions are made for, the
// decision record, and the static rule used where nothing was measured. Pure host
// logic: no GPU needed.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tpdecode/tensor.hpp"

namespace tpdecode {

// ---- Hardware (sm_90: H100, H200) -------------------------------------------------
inline constexpr int kSmemPerSm = 228 * 1024;
inline constexpr int kSmemPerCtaMax = 227 * 1024;  // the most one CTA may ask for
inline constexpr int kSmemReservedPerCta = 1024;   // the runtime's share of each CTA

// ---- Paths and the decision record --------------------------------------------
enum class GemmPath : uint8_t {
  kWarpSplitK,  // the warp split-K engine (warp_splitk.cuh)
  kCublas,      // cublasGemmEx with cuBLAS's default algorithm (the stock path)
  kStreamK,     // the stream-K engine (stream_k.cuh)
  kCublasLt,    // cublasLtMatmul with an algorithm the tuner measured
};
const char* gemm_path_name(GemmPath p);  // "warp", "cublas", "stream", "cublaslt"

// Where a decision came from.
enum class GemmSource : uint8_t { kRule, kTuned, kCache, kAgreed, kForced };
const char* gemm_source_name(GemmSource s);  // "rule", "tuned", "cache", "agreed", "forced"

// The bytes of a cublasLtMatmulAlgo_t (opaque here; cublas_context.cpp reads them).
using CublasLtAlgo = std::array<uint64_t, 8>;

// What DecodeGemm runs for one (GPU, N, K, M bucket): trivially copyable (a team
// broadcasts it between ranks) and small.
struct GemmDecision {
  GemmPath path = GemmPath::kCublas;
  GemmSource source = GemmSource::kRule;
  uint8_t split = 1;        // kWarpSplitK: CTAs per cluster (1 .. 8)
  uint8_t variant = 0;      // kStreamK: index into kStreamVariants
  float measured_us = 0;    // the tuner's median time per call (0: not measured)
  float tune_ms = 0;        // what deciding cost (timing every candidate)
  CublasLtAlgo lt_algo{};   // kCublasLt
  // The same kernel and launch shape (source and times aside): bitwise the same result.
  bool same_path(const GemmDecision& o) const {
    return path == o.path && split == o.split && variant == o.variant && lt_algo == o.lt_algo;
  }
};
std::string describe(const GemmDecision& d);  // e.g. "stream v2", "warp split 8", "cublaslt #3fa9c1"
// Decisions to force (DecodeGemm::force) or compare with.
GemmDecision warp_decision(int split);
GemmDecision stream_decision(int variant);
GemmDecision cublas_decision();

// ---- M buckets -------------------------------------------------------------------
// Decisions are made per bucket of row counts: 1, 2, 3-4, 5-8, 9-12, 13-16, 17-24,
// 25-32. A bucket never straddles the engines' token tiles (8, 16, 32 rows).
inline constexpr int kGemmBuckets = 8;
int gemm_m_bucket(int m);         // 1 <= m <= kWarpMaxRows
int gemm_bucket_min(int bucket);
int gemm_bucket_max(int bucket);  // the row count the tuner times

// ---- The warp split-K engine ---------------------------------------------------
// Most activation rows the engines take in one launch (four 8-token MMA tiles).
inline constexpr int kWarpMaxRows = 32;
// K is streamed in chunks of this many columns (one ring stage per warp).
inline constexpr int kWarpChunkK = 128;
inline constexpr int kWarpMaxSplit = 8;  // CTAs of a cluster (the portable cluster size)

// 16-row output tiles and K a multiple of 128 (N, K > 0, N * K <= 2^40). Seed 004
// also bounds K (64 tiles of 128, or of 256); this engine streams any K: each CTA
// of a cluster takes 1/split of it.
bool warp_eligible(int64_t n, int64_t k);

// The weight suits the engine: bf16, contiguous, 16-byte aligned, an eligible
// shape, at most 65535 blocks of 64 rows (the grid's y limit).
bool warp_weight_ok(const TensorView& weight);
// The activations suit the engines: 1..32 rows, contiguous, 16-byte aligned.
bool warp_activations_ok(const TensorView& x);

// Launch shape of one engine call.
struct GemmTactic {
  int token_tiles = 1;  // 8-token MMA tiles per CTA: 1, 2 or 4 (M <= 8, 16, 32)
  int split = 1;        // CTAs per 64-row block (a cluster), each a K range; 1 .. 8
  int64_t blocks = 0;   // ceil(N / 64)
  int64_t ctas = 0;     // blocks * split
  double predicted_us = 0;  // the rule's time model (see choose_tactic)
  bool engine_preferred = false;  // the rule expects the engine to beat cuBLAS here
  std::string describe() const;  // e.g. "33 blocks x split 8, 1 token tile"
};

// Engine constants the rule needs (fixed by the kernel).
inline constexpr int kWarpWarps = 4;          // warps per CTA, each one 16-row tile of W
inline constexpr int kWarpCtaRows = 64;       // W rows per CTA
inline constexpr int kWarpStages = 4;         // ring stages
inline constexpr int kWarpStageBytes = 4096;  // [16 rows, 128] bf16 per warp and stage

// Token tiles for m rows (1 <= m <= kWarpMaxRows); the stream-K engine uses the same.
int warp_token_tiles(int m);

// Dynamic shared memory of one CTA: the W and x rings plus the FP32 partials.
int warp_smem_bytes(int token_tiles);
// CTAs one SM holds at that size (228 KB per SM, 1 KB reserved per CTA).
int warp_ctas_per_sm(int token_tiles);

// The rule. For each legal split s (1..8, or the powers of two only) it models the
// ceil(N / 64) clusters running in rounds of R(s) resident clusters (measured per
// split on a 132-SM H200, scaled by the SM count: a cluster sits in one GPC), each
// round taking
//   bytes of its clusters / min(4.0 TB/s, CTAs * 12 GB/s (x 0.7 above 8 rows)) + 0.5 us
// plus 1 us of launch; a larger split must win by 2 %. Few 64-row blocks leave SMs
// idle: a K split across a cluster fills them; a split whose clusters do not all fit
// adds a mostly empty round. engine_preferred: M <= 16 and the model's time at most
// cuBLAS's (5 us + N*K*2 / 3.8 TB/s). The constants are fitted to measurements.
GemmTactic choose_tactic(int64_t n, int64_t k, int m, int sms, bool powers_of_two = false);
// A split the engine runs for K: 1 .. 8 CTAs per cluster, each with at least two
// 128-column chunks when split > 1. The tuner times every one of them.
bool warp_split_ok(int64_t k, int split);
// The splits timed where several ranks' GEMMs share one GPU (a local team): the
// powers of two. Timed alone, 3 and 6 win some drafter shapes, but beside seven
// other ranks' GEMMs they were slower (docs/performance.md, 2026-12-01).
bool warp_split_for_shared_gpu(int split);
// The rule's tactic with the split forced (benchmarks, tests); split must be legal.
GemmTactic tactic_with_split(int64_t n, int64_t k, int m, int sms, int split);

// ---- The stream-K engine ---------------------------------------------------------
// Candidate launch configurations of the stream-K engine. Nothing fitted picks
// among them: the tuner times each (with the warp engine and cuBLAS) on the real
// weight. Why these: 512 B-1 KB bulk copies per weight row (the request sizes the
// issue asks for; the cp.async engine's 16-byte copies reached 87-92 % of a plain
// read), the deepest ring one CTA per SM holds (most bytes in flight for a lone
// call), half an SM's shared memory so that under programmatic dependent launch
// the next GEMM's CTA fits beside this one and fills its ring during this one's
// tail, and an L2 prefetch of the weight bytes past the ring before waiting for the
// previous kernel (chains of small GEMMs: HBM stays busy across the boundary, as a
// plain read chain with PDL does).
struct StreamVariant {
  int stage_cols;   // K columns per ring stage: one bulk copy of 2 * stage_cols bytes per row
  int ctas_per_sm;  // grid = ctas_per_sm * SMs (fewer where the weight is small)
  int smem_share;   // the CTA takes 1 / smem_share of the SM's shared memory
  int l2_prefetch_kb;  // weight KB past the ring requested into L2 before griddepcontrol.wait
};
inline constexpr std::array<StreamVariant, 5> kStreamVariants = {{
    {256, 1, 1, 0},    // v0: 512 B per row and stage, deepest ring
    {512, 1, 1, 0},    // v1: 1 KB per row and stage (fits up to 8 rows only)
    {128, 1, 2, 128},  // v2: half the SM: the next kernel's CTA prefetches beside it
    {128, 2, 2, 0},    // v3: two CTAs per SM
    {256, 1, 1, 128},  // v4: v0 with the L2 prefetch
}};
inline constexpr int kStreamMinStages = 3;  // fewer leaves one stage in flight while one is read
inline constexpr int kStreamMaxStages = 8;

// N % 16 == 0, K % 128 == 0 (any K: no limit on K tiles) and N * K <= 2^40.
bool stream_eligible(int64_t n, int64_t k);
// The weight suits the engine: bf16, contiguous, 16-byte aligned, an eligible shape.
bool stream_weight_ok(const TensorView& weight);

struct StreamTactic {
  int variant = 0;
  int token_tiles = 1;
  int stage_cols = 0;
  int stages = 0;
  int l2_prefetch_bytes = 0;  // per CTA
  int ctas = 0;        // the grid: the (64-row tile, 16-column step) sequence split evenly
  int smem_bytes = 0;
  int64_t tiles = 0;           // ceil(N / 64)
  int64_t steps_per_tile = 0;  // K / 16
  int64_t total_steps = 0;     // tiles * steps_per_tile
  std::string describe() const;  // e.g. "v0: 132 CTAs, 5 stages of 256 columns"
};
// Whether the variant's ring holds kStreamMinStages stages at this M's token tiles.
bool stream_variant_fits(int m, int variant);
// The launch shape; InvalidArgument where the shape is not eligible or the variant does not fit.
StreamTactic stream_tactic(int64_t n, int64_t k, int m, int sms, int variant);

// ---- Candidates and the static rule -------------------------------------------
// What the weight and the activations allow (set by DecodeGemm from the operands).
struct GemmEngines {
  bool warp = false;    // warp_weight_ok
  bool stream = false;  // stream_weight_ok
};

// Every engine tactic that can run (N, K, m), then stock cuBLAS: what the tuner
// times (DecodeGemm adds cuBLASLt's heuristic algorithms on the GPU).
std::vector<GemmDecision> engine_candidates(int64_t n, int64_t k, int m, GemmEngines engines);
// The static rule (no measurement): the warp engine where choose_tactic prefers it
// (at its split; among the powers of two where ranks share the GPU), else cuBLAS.
GemmDecision rule_decision(int64_t n, int64_t k, int m, int sms, GemmEngines engines, bool shared_gpu = false);
// An engine decision runs on this shape (cuBLAS always; cuBLASLt is checked on the GPU).
bool engine_decision_legal(const GemmDecision& d, int64_t n, int64_t k, int m, int sms, GemmEngines engines);

}  // namespace tpdecode
