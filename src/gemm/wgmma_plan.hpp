// The wgmma engine's shared-memory plan, shared by its kernel (wgmma_tiles.cuh) and
// the host (its tactics, launch sizes): constexpr functions of the launch's
// template shape (64-row tiles per stage, token tile) and its ring depth.
#pragma once

#include <cstdint>

namespace tpdecode::wgmma {

inline constexpr int kChunkK = 64;         // K columns per ring stage: one 128-byte swizzle row per weight row
inline constexpr int kTileRows = 64;       // weight rows of one wgmma (its M)
inline constexpr int kTileBytes = kTileRows * kChunkK * 2;  // one [64, 64] bf16 weight tile: 8 KB
inline constexpr int kConsumerThreads = 128;                // one warpgroup runs every wgmma
inline constexpr int kThreads = kConsumerThreads + 64;      // + the weight producer warp + the activation producer warp
inline constexpr int kMaxStages = 32;
inline constexpr int kMinStages = 3;       // one being multiplied, one released late, one in flight
inline constexpr int kMaxTokens = 64;      // wgmma's N: tokens rounded up to 8, 16, 32 or 64
inline constexpr int kPartialPad = 4;      // floats after each token's row of partials: the 4 lanes of a
                                           // quad store 4 tokens apart into different banks
inline constexpr int kAlign = 1024;        // the 128-byte swizzle repeats every 8 rows of 128 bytes

// Byte offsets of one CTA's shared memory, from a 1024-aligned base:
//   [stages] x { W [sub_tiles * 64 rows, 64] bf16 | x [tokens, 64] bf16 }   (both 128-byte swizzled)
//   [2] x partials [tokens, sub_tiles * 64 + pad] f32                          (double-buffered)
//   full[stages], empty[stages], ready[2], freed[2] mbarriers
struct Layout {
  int w_bytes = 0;      // one stage's weight tile
  int x_bytes = 0;      // one stage's activation tile
  int stage_bytes = 0;
  int stages = 0;
  int partial_stride = 0;  // floats per token in the partials
  int partial_bytes = 0;   // one partial buffer
  int partials_offset = 0;
  int barriers_offset = 0;
  int bytes = 0;           // from the aligned base
  int smem_bytes = 0;      // what the launch asks for: bytes + the alignment slack
};

constexpr Layout layout(int sub_tiles, int tokens, int stages) {
  Layout l;
  l.w_bytes = sub_tiles * kTileBytes;
  l.x_bytes = tokens * kChunkK * 2;  // a multiple of 1024: tokens is a multiple of 8
  l.stage_bytes = l.w_bytes + l.x_bytes;
  l.stages = stages;
  l.partial_stride = sub_tiles * kTileRows + kPartialPad;
  l.partial_bytes = tokens * l.partial_stride * 4;
  l.partials_offset = stages * l.stage_bytes;
  l.barriers_offset = l.partials_offset + 2 * l.partial_bytes;
  l.bytes = l.barriers_offset + (2 * stages + 4) * 8;
  l.smem_bytes = l.bytes + kAlign;
  return l;
}

// The deepest ring within `budget` bytes of shared memory (0 where not even
// kMinStages fit).
constexpr int stages_within(int sub_tiles, int tokens, int budget) {
  int stages = 0;
  while (stages < kMaxStages && layout(sub_tiles, tokens, stages + 1).smem_bytes <= budget) ++stages;
  return stages >= kMinStages ? stages : 0;
}

// The token tile for m rows (1 <= m <= kMaxTokens).
constexpr int token_tile(int m) { return m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : 64; }

// The (sub-tiles, token tile) kernels built: 4 accumulator chains x sub-tiles x
// tokens / 2 registers per thread, at most 128.
constexpr bool shape_built(int sub_tiles, int tokens) {
  return (sub_tiles == 1 || sub_tiles == 2 || sub_tiles == 4) &&
         (tokens == 8 || tokens == 16 || tokens == 32 || tokens == 64) && sub_tiles * tokens <= 64;
}

}  // namespace tpdecode::wgmma
