// Which shapes the warp split-K engine takes (seed 004) and how it is launched
// for a given (N, K, M) on a given GPU. Pure host logic: no GPU needed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "tpdecode/tensor.hpp"

namespace tpdecode {

// Most activation rows the engine takes in one launch (four 8-token MMA tiles).
inline constexpr int kWarpMaxRows = 32;
// K is streamed in chunks of this many columns (one ring stage per warp).
inline constexpr int kWarpChunkK = 128;

// Engine constants the rule needs (fixed by the kernel).
inline constexpr int kWarpWarps = 4;          // warps per CTA, each one 16-row tile of W
inline constexpr int kWarpCtaRows = 64;       // W rows per block (one block at a time per CTA)
inline constexpr int kWarpStageBytes = 4096;  // [16 rows, 128] bf16 per warp and stage
inline constexpr int kWarpMaxSplit = 8;       // CTAs per cluster (the portable cluster size)
inline constexpr int kWarpSmemLimit = 227 * 1024;  // dynamic shared memory one CTA may use (sm_90)

// Seed 004: 16-row output tiles, K a multiple of 128, and at most 64 K tiles of
// 128 (or of 256 when K % 256 == 0). N, K > 0.
bool warp_eligible(int64_t n, int64_t k);

// The weight suits the engine: bf16, contiguous, 16-byte aligned, an eligible shape.
bool warp_weight_ok(const TensorView& weight);
// The activations suit the engine: 1..32 rows, contiguous, 16-byte aligned.
bool warp_activations_ok(const TensorView& x);

// Token tiles for m rows (1 <= m <= kWarpMaxRows): 1, 2 or 4 tiles of 8 tokens.
int warp_token_tiles(int m);

// Dynamic shared memory of one CTA: the W ring (stages x 4 warps x 4 KB), the FP32
// partials of two blocks and the CTA's whole K slice of x ([chunks, 8 x tiles, 128] bf16).
int warp_smem_bytes(int token_tiles, int stages, int chunks_per_rank);

// How many clusters of `split` CTAs, each using `smem_bytes` of dynamic shared
// memory, the GPU holds at once. DecodeGemm asks the CUDA occupancy calculator;
// uniform_residency is the arithmetic for `sms` SMs of 228 KB (tests, planning).
using ClusterResidency = std::function<int(int token_tiles, int stages, int split, int smem_bytes)>;
ClusterResidency uniform_residency(int sms);

// Launch shape of one engine call. The grid is persistent: `clusters` clusters of
// `split` CTAs, all resident at once; cluster c handles the 64-row blocks c,
// c + clusters, c + 2 x clusters, ...; a CTA streams the rows of its blocks over
// its K slice (1/split of K) and keeps that slice of x in shared memory.
struct GemmTactic {
  int token_tiles = 1;     // 8-token MMA tiles: 1, 2 or 4 (M <= 8, 16, 32)
  int split = 1;           // CTAs per cluster, each 1/split of K: 1, 2, 4 or 8
  int stages = 8;          // W ring stages per warp: 4, 6 or 8
  int64_t blocks = 0;      // ceil(N / 64)
  int64_t clusters = 0;    // resident clusters launched (grid y), <= blocks
  int64_t rounds = 0;      // blocks per cluster, at most: ceil(blocks / clusters)
  int chunks_per_rank = 0; // most 128-column chunks of K one CTA streams per block
  int smem_bytes = 0;
  double predicted_us = 0;        // the rule's time model (see choose_tactic)
  bool engine_preferred = false;  // the rule expects the engine to beat cuBLAS here
  bool runnable() const { return clusters > 0; }
  std::string describe() const;   // e.g. "33 blocks on 33 clusters x split 4, 8 stages, 1 token tile"
};

// The rule. Among the splits s in {1, 2, 4, 8} that leave each CTA >= 2 chunks of
// 128 and the deepest ring (8, 6 or 4 stages) whose shared memory fits with the
// x slice, it models
//   clusters = min(blocks, resident clusters),  rounds = ceil(blocks / clusters)
//   per-CTA rate = min(ring bytes / 2.5 us (Little's law), 4.0 TB/s / CTAs)
//   time = 2 us + rounds x 64 rows x K/s x 2 B / per-CTA rate
// and a larger split must win by 2 %. Few 64-row blocks leave SMs idle: a K split
// fills them; a block count just above the resident clusters costs a whole round.
// engine_preferred: where the engine was measured ahead of cuBLAS (see the .cpp).
// If no launch shape fits (a GPU that holds no such cluster), the tactic is not
// runnable() and the dispatch keeps cuBLAS.
GemmTactic choose_tactic(int64_t n, int64_t k, int m, const ClusterResidency& residency);
// The rule's tactic with the split (and optionally the stages) forced, for
// benchmarks and tests; InvalidArgument if that split or ring does not fit.
GemmTactic tactic_with_split(int64_t n, int64_t k, int m, const ClusterResidency& residency, int split,
                             int stages = 0);

}  // namespace tpdecode
