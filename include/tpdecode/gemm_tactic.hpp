// Which shapes the warp split-K engine takes (seed 004) and how it is launched
// for a given (N, K, M, SM count). Pure host logic: no GPU needed.
#pragma once

#include <cstdint>
#include <string>

#include "tpdecode/tensor.hpp"

namespace tpdecode {

// Most activation rows the engine takes in one launch (four 8-token MMA tiles).
inline constexpr int kWarpMaxRows = 32;
// K is streamed in chunks of this many columns (one ring stage per warp).
inline constexpr int kWarpChunkK = 128;

// Seed 004: 16-row output tiles, K a multiple of 128, and at most 64 K tiles of
// 128 (or of 256 when K % 256 == 0). N, K > 0.
bool warp_eligible(int64_t n, int64_t k);

// The weight suits the engine: bf16, contiguous, 16-byte aligned, an eligible
// shape, at most 65535 row tiles (the grid's y limit).
bool warp_weight_ok(const TensorView& weight);
// The activations suit the engine: 1..32 rows, contiguous, 16-byte aligned.
bool warp_activations_ok(const TensorView& x);

// Launch shape of one engine call.
struct GemmTactic {
  int token_tiles = 1;  // 8-token MMA tiles per CTA: 1, 2 or 4 (M <= 8, 16, 32)
  int split = 1;        // CTAs per 16-row tile (a cluster), each a K range; 1, 2, 4 or 8
  int64_t tiles = 0;    // N / 16
  int64_t ctas = 0;     // tiles * split
  double predicted_us = 0;  // the rule's time model (see choose_tactic)
  std::string describe() const;  // e.g. "tiles 132 x split 2, 2 token tiles"
};

// Engine constants the rule needs (fixed by the kernel).
inline constexpr int kWarpWarps = 4;          // warps per CTA, each its own K range
inline constexpr int kWarpStages = 4;         // ring stages per warp
inline constexpr int kWarpStageBytes = 4096;  // [16 rows, 128] bf16 per warp stage

// Token tiles for m rows (1 <= m <= kWarpMaxRows).
int warp_token_tiles(int m);

// Dynamic shared memory of one CTA: the warps' rings plus the FP32 partials.
int warp_smem_bytes(int token_tiles);
// CTAs one SM holds at that size (228 KB per SM, 1 KB reserved per CTA).
int warp_ctas_per_sm(int token_tiles);

// The rule. Time model per split s in {1, 2, 4, 8} (each warp must keep >= 1 chunk):
//   hbm  = N*K*2 bytes / 4.3 TB/s                       (the read ceiling)
//   sm   = bytes of the busiest SM / what its copies in flight can pull,
//          in flight = resident CTAs * warps * (stages - 1) * 4 KB, over ~2 us
//   time = max(hbm, sm) + 0.25 us per doubling of the cluster (DSMEM reduction)
// and the smallest split within 2 % of the best wins. Where a single SM's share
// is too small to keep the stream busy (few tiles), splitting K across a cluster
// puts more CTAs -- more bytes in flight -- on every SM.
GemmTactic choose_tactic(int64_t n, int64_t k, int m, int sms);
// The rule's tactic with the split forced (benchmarks, tests); split must be legal.
GemmTactic tactic_with_split(int64_t n, int64_t k, int m, int sms, int split);

}  // namespace tpdecode
