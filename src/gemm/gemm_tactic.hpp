// How DecodeGemm can run a shape: which shapes each engine takes, their launch
// shapes for (N, K, M, SM count), the candidates the tuner times, and the static
// rule used where nothing was measured (the decision record and the M buckets are
// public: tpdecode/gemm_decision.hpp). Pure host logic: no GPU needed.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tpdecode/gemm_decision.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode {

// ---- Hardware (sm_90: H100, H200) -------------------------------------------------
inline constexpr int kSmemPerSm = 228 * 1024;
inline constexpr int kSmemPerCtaMax = 227 * 1024;  // the most one CTA may ask for
inline constexpr int kSmemReservedPerCta = 1024;   // the runtime's share of each CTA

// ---- The warp split-K engine ---------------------------------------------------
// Most activation rows the engine takes in one launch (eight 8-token MMA tiles).
inline constexpr int kWarpMaxRows = 64;
// Most rows at which the engine is a candidate: of the rule's model (its residency
// tables are measured at 2 and 3 CTAs per SM, 1 to 4 token tiles) and of the
// tuner. Above, it runs where forced or batch-invariant only: at 64 rows it was
// measured 1.5-3 x behind cuBLASLt on the TP 8 shapes (docs/performance.md).
inline constexpr int kWarpCandidateMaxRows = 32;
// K is streamed in chunks of this many columns (one ring stage per warp).
inline constexpr int kWarpChunkK = 128;
inline constexpr int kWarpMaxSplit = 8;  // CTAs of a cluster (the portable cluster size)

// 16-row output tiles and K a multiple of 128 (N, K > 0, N * K <= 2^40); any such
// K: each CTA of a cluster streams 1/split of it.
bool warp_eligible(int64_t n, int64_t k);

// The weight suits the engine: bf16, contiguous, 16-byte aligned, an eligible
// shape, at most 65535 blocks of 64 rows (the grid's y limit).
bool warp_weight_ok(const TensorView& weight);

// Launch shape of one engine call.
struct GemmTactic {
  int token_tiles = 1;  // 8-token MMA tiles per CTA: 1, 2, 4 or 8 (M <= 8, 16, 32, 64)
  int split = 1;        // CTAs per row block (a cluster), each a K range; 1 .. 8
  int row_tiles = 4;    // 16-row tiles of W per CTA: 4 (one per warp), 2 or 1 (warps split K)
  bool tensor_map = false;  // the one-tile CTA's tensor-map form
  int64_t blocks = 0;   // ceil(N / (16 row_tiles))
  int64_t ctas = 0;     // blocks * split
  double predicted_us = 0;  // the rule's time model (see choose_tactic)
  bool engine_preferred = false;  // the rule expects the engine to beat cuBLAS here
  std::string describe() const;  // e.g. "33 blocks x split 8, 1 token tile"
};

// Engine constants the rule needs (fixed by the kernel).
inline constexpr int kWarpWarps = 4;          // warps per CTA, each one 16-row tile of W
inline constexpr int kWarpCtaRows = 64;       // W rows per CTA (the wide CTA: a tile per warp)
inline constexpr int kWarpStages = 4;         // ring stages
inline constexpr int kWarpStageBytes = 4096;  // [16 rows, 128] bf16 per warp and stage
// The narrow CTAs: one 16-row tile of W, its four warps taking every fourth chunk of
// the CTA's K range (each copies its own x slices), the four sums added in warp
// order; or two tiles, two warps on each, a pair taking every other chunk with one
// x slice (half the x traffic per weight byte: at 8 rows the one-tile CTA reads
// half as many bytes of x from L2 as of W). Four (two) times the CTAs of the wide
// one over the same rows, with no cluster needed to fill the SMs where N is short
// (tinygemm2's 16-row CTAs lead there). Up to 16 rows: the x rings grow with the
// tokens.
inline constexpr int kWarpNarrowMaxRows = 16;
// The one-tile narrow CTA has a second form: W by tensor-map boxes onto mbarriers,
// fragments by ldmatrix (narrow_tma_loop.cuh); a decision of it has `stages` set to
// its ring's depth. Its rings from a 1024-byte aligned base (the 128-byte swizzle's
// period): W [stages, 4 warps] x 4 KB, x [4 warps, stages, tokens, 128] bf16, an
// mbarrier per warp and stage.
inline constexpr int kNarrowTmaStages = 4;
constexpr int narrow_tma_ring_bytes(int token_tiles) {
  return kNarrowTmaStages * kWarpWarps * kWarpStageBytes + kWarpWarps * kNarrowTmaStages * 8 * token_tiles * 256 +
         kWarpWarps * kNarrowTmaStages * 8;
}

// Token tiles for m rows (1 <= m <= kWarpMaxRows): 1, 2, 4 or 8.
int warp_token_tiles(int m);

// Dynamic shared memory of one CTA: the W and x rings plus the FP32 partials (the
// tensor-map form: and 1 KB to align its rings).
int warp_smem_bytes(int token_tiles, int row_tiles = kWarpWarps, bool tensor_map = false);
// CTAs one SM holds at that size (228 KB per SM, 1 KB reserved per CTA).
int warp_ctas_per_sm(int token_tiles, int row_tiles = kWarpWarps, bool tensor_map = false);
// A warp decision of the tensor-map form (one row tile, stages kNarrowTmaStages).
bool warp_tensor_map(const GemmDecision& d);
// The weight suits the tensor-map form (a one-tile CTA): its map can be made.
bool warp_tensor_map_ok(int64_t n, int64_t k);
// The CTA shapes of a warp decision (GemmDecision::sub_tiles): 4 row tiles, or the
// narrow 2 and 1 up to kWarpNarrowMaxRows rows.
inline constexpr std::array<int, 3> kWarpRowTileChoices = {kWarpWarps, 2, 1};
bool warp_row_tiles_ok(int row_tiles, int m);
// Rows one launch of a warp decision takes at m rows: all of them for the wide CTA;
// at most kWarpNarrowMaxRows for the narrow ones, which run more as consecutive
// launches of that many (a row's sum does not depend on the launch it is in, so
// batch-invariant mode runs a narrow decision at every row count).
int warp_launch_rows(int row_tiles, int m);

// The rule. For each legal split s (1..8, or the powers of two only) it models the
// ceil(N / 64) clusters running in rounds of R(s) resident clusters (measured per
// split on a 132-SM H200, scaled by the SM count: a cluster sits in one GPC), each
// round taking
//   bytes of its clusters / min(4.0 TB/s, CTAs * 12 GB/s (x 0.7 above 8 rows)) + 0.5 us
// plus 1 us of launch; a larger split must win by 2 %. Few 64-row blocks leave SMs
// idle: a K split across a cluster fills them; a split whose clusters do not all fit
// adds a mostly empty round. engine_preferred: M <= 16 and the model's time at most
// cuBLAS's (5 us + N*K*2 / 3.8 TB/s). The constants are fitted to measurements.
// 1 <= m <= kWarpCandidateMaxRows.
GemmTactic choose_tactic(int64_t n, int64_t k, int m, int sms, bool powers_of_two = false);
// A split the engine runs for K: 1 .. 8 CTAs per cluster, each with at least two
// 128-column chunks when split > 1. The tuner times every one of them.
bool warp_split_ok(int64_t k, int split);
// The splits timed where several ranks' GEMMs share one GPU (a local team): the
// powers of two, for both engines. Timed alone, the warp engine's 3 and 6 win some
// drafter shapes, but beside seven other ranks' GEMMs they were slower
// (docs/history/performance-2026-11.md, "Every split 1–8").
bool warp_split_for_shared_gpu(int split);
// The launch shape of a warp-engine call (no prediction): any m up to
// kWarpMaxRows (kWarpNarrowMaxRows for 1 or 2 row tiles); split must be legal.
GemmTactic warp_launch_tactic(int64_t n, int64_t k, int m, int split, int row_tiles = kWarpWarps,
                              bool tensor_map = false);
// The rule's tactic with the split forced (benchmarks, tests); split must be legal.
GemmTactic tactic_with_split(int64_t n, int64_t k, int m, int sms, int split);

// ---- The wgmma engine ------------------------------------------------------------
// Either form of the engine (the weight as wgmma's A, or the wide form).
inline bool wgmma_path(GemmPath p) { return p == GemmPath::kWgmma || p == GemmPath::kWgmmaWide; }
// K a multiple of 64 (the 128-byte rows of its tiles), N and K below 2^31 (tensor-map
// coordinates), N * K <= 2^40.
bool wgmma_eligible(int64_t n, int64_t k);
// The weight suits the engine: bf16, contiguous, 16-byte aligned, an eligible shape.
bool wgmma_weight_ok(const TensorView& weight);
// A split the engine runs for K: 1 .. 8 CTAs per cluster, each with at least two
// 64-column chunks when split > 1.
bool wgmma_split_ok(int64_t k, int split);
// The shared memory a CTA may take: all an SM gives one CTA, or half an SM (so that
// the next kernel's CTA fits beside it and prefetches its weights during this one's
// tail: it measured faster on most shapes, docs/performance.md).
inline constexpr int kWgmmaFullBudget = kSmemPerCtaMax;
inline constexpr int kWgmmaHalfBudget = kSmemPerSm / 2 - kSmemReservedPerCta;
// The engine's tactics the tuner times for m rows (clusters 0: as many as fit):
// every built sub-tile count at every legal split, with the deepest ring of each
// budget that holds kMinStages stages.
std::vector<GemmDecision> wgmma_candidates(int64_t n, int64_t k, int m);
// The wide form's tactics (the weight tile as wgmma's B, wgmma_plan.hpp) for m rows:
// every block size of kWideRows at the legal splits whose CTAs fill 70-100 % of
// `sms` SMs in one wave (split 1 where the blocks alone are more; else the fullest
// wave; every legal split where sms is 0), the deepest ring (a half-SM one would not
// let the next kernel's CTA in: a wide CTA holds 160-253 registers a thread, 30-49 K
// of the SM's 64 K); none at m <= kWideMinRows (below, the weight as A reads little
// x per weight byte).
inline constexpr int kWideMinRows = 16;
std::vector<GemmDecision> wgmma_wide_candidates(int64_t n, int64_t k, int m, int sms = 0);

// The static rule of batch-invariant mode (tuning off; with tuning it is the
// fallback of the tuned order, DecodeGemm::invariant_order): what a batch-invariant
// DecodeGemm runs at every row count 1 .. kGemmMaxRows, one engine at one split per
// shape, so that a row's summation order (the split's K ranges, each walked in
// order, the partials summed in rank order) never depends on how many rows the call
// has. The same on every rank of a team: a function of the
// shape, the SM count, the engines that take the weight, whether ranks share the
// GPU and `rows`, the row count the calls mostly have (1..kGemmMaxRows). The warp
// engine where the static rule prefers it at `rows` rows (at the rule's split for
// them; never above 16 rows), or where the wgmma engine does not take the weight:
// it runs decode-sized calls as fast as the default. Where the rule does not prefer
// it and `rows` <= 8, the narrow CTA at narrow_invariant_split if there is one (its
// tensor-map form where the weight has a map): few
// 64-row blocks leave the wide CTA's clusters short of the SMs (TP 8's 896 x 35840:
// narrow split 4 17.3 us at M 1 against cuBLAS's 20.6 and the wgmma engine's 22.8;
// docs/performance.md); its calls above 16 rows run as launches of 16. Else the
// wgmma engine at invariant_split, 64-row tiles and the half-SM ring (the full one
// at 64 tokens).
GemmDecision invariant_decision(int64_t n, int64_t k, int m, int sms, GemmEngines engines, bool shared_gpu,
                                int rows);
// The narrow CTA's split in batch-invariant mode: the largest legal split (powers of
// two where ranks share the GPU) at which all ceil(N / 16) clusters are resident at
// once at one token tile (two CTAs per SM) and fill every SM; 0 where none does.
// Why one wave: past it a second, mostly empty round of clusters follows (896 x
// 35840 at M 1: split 4 17.3 us, split 5 23.6).
int narrow_invariant_split(int64_t n, int64_t k, int sms, bool powers_of_two = false);
// The decision of one summation order as a batch-invariant GEMM runs it at m rows:
// a warp decision as it is; a wgmma one with its tiles where they are built for m's
// token tile (else 64-row tiles) and the deepest half-SM ring (the full one at 64
// tokens): neither changes the bits.
GemmDecision invariant_member(const GemmDecision& order, int m);
// Whether two engine decisions sum every row in the same order: the same engine
// and split (and, for the warp engine, the same CTA shape).
bool same_summation_order(const GemmDecision& a, const GemmDecision& b);
// The summation orders a batch-invariant GEMM may take, as they run at m rows (the
// tuner times them at the row count the calls mostly have): the wide and the narrow
// warp CTA at every legal split and the wgmma engine's candidates (the powers of two
// where ranks share the GPU). Each runs every row count 1 .. kGemmMaxRows.
std::vector<GemmDecision> invariant_candidates(int64_t n, int64_t k, int m, GemmEngines engines, bool shared_gpu);
// The wgmma engine's invariant split: the fewest CTAs per cluster whose 64-row
// blocks times the split fill the SMs, at most 8 and legal for K (powers of two
// only where ranks share the GPU).
int invariant_split(int64_t n, int64_t k, int sms, bool powers_of_two = false);

// ---- Candidates and the static rule -------------------------------------------
// The activations suit both engines: 1..64 rows, contiguous, 16-byte aligned (each
// reads x in 16-byte pieces of whole rows, or TMA boxes of them; out any stride).
bool engine_activations_ok(const TensorView& x);
// Every engine tactic that can run (N, K, m) (the warp engine's up to
// kWarpCandidateMaxRows, its narrow CTAs up to kWarpNarrowMaxRows), then stock cuBLAS: what the tuner times (DecodeGemm adds
// cuBLASLt's heuristic algorithms on the GPU).
std::vector<GemmDecision> engine_candidates(int64_t n, int64_t k, int m, GemmEngines engines, int sms = 0);
// The static rule (no measurement): the warp engine where choose_tactic prefers it
// (at its split; among the powers of two where ranks share the GPU), else cuBLAS.
// It never picks the wgmma engine, whose tactics are only ever measured.
GemmDecision rule_decision(int64_t n, int64_t k, int m, int sms, GemmEngines engines, bool shared_gpu = false);
// An engine decision runs on this shape (cuBLAS always; cuBLASLt is checked on the
// GPU; a wgmma decision's clusters 0 stands for as many as fit).
bool engine_decision_legal(const GemmDecision& d, int64_t n, int64_t k, int m, int sms, GemmEngines engines);

}  // namespace tpdecode
