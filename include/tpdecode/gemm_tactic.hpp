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
// shape, at most 65535 blocks of 64 rows (the grid's y limit).
bool warp_weight_ok(const TensorView& weight);
// The activations suit the engine: 1..32 rows, contiguous, 16-byte aligned.
bool warp_activations_ok(const TensorView& x);

// Launch shape of one engine call.
struct GemmTactic {
  int token_tiles = 1;  // 8-token MMA tiles per CTA: 1, 2 or 4 (M <= 8, 16, 32)
  int split = 1;        // CTAs per 64-row block (a cluster), each a K range; 1, 2, 4 or 8
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

// Token tiles for m rows (1 <= m <= kWarpMaxRows).
int warp_token_tiles(int m);

// Dynamic shared memory of one CTA: the W and x rings plus the FP32 partials.
int warp_smem_bytes(int token_tiles);
// CTAs one SM holds at that size (228 KB per SM, 1 KB reserved per CTA).
int warp_ctas_per_sm(int token_tiles);

// The rule. For each split s in {1, 2, 4, 8} (s > 1 needs >= 2 chunks of 128
// per cluster rank) it models
//   in flight = min(CTAs, SMs * CTAs per SM) * stages * 16 KB
//   rate      = min(4.0 TB/s, in flight / 2.5 us)            (Little's law)
//   time      = 1 us + N*K*2 / rate * ceil(rounds) / rounds,  rounds = CTAs / slots
// and a larger split must win by 2 %. Few 64-row blocks (small N) leave SMs idle
// or short of copies in flight: a K split across a cluster fills them; too many
// CTAs leave a partial last round. The constants are fitted to measurements.
// engine_preferred: M <= 8, at most SMs / 2 blocks of 64 rows and 4096 <= K <= 8192 --
// where the engine was measured ahead of cuBLAS; elsewhere the dispatch keeps cuBLAS.
GemmTactic choose_tactic(int64_t n, int64_t k, int m, int sms);
// The rule's tactic with the split forced (benchmarks, tests); split must be legal.
GemmTactic tactic_with_split(int64_t n, int64_t k, int m, int sms, int split);

}  // namespace tpdecode
