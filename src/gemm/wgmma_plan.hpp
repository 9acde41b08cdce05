// The wgmma engine's shared-memory plan, shared by its kernels (wgmma_tiles.cuh) and
// the host (its tactics, launch sizes): constexpr functions of the launch's
// template shape (the weight rows per stage, the token tile) and its ring depth, in
// both forms (the weight as wgmma's A, or the wide form's B).
#pragma once

#include <array>
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
//   [stages] x { W [w_rows, 64] bf16 | x [x_rows, 64] bf16 }   (both 128-byte swizzled)
//   [partial_buffers] x partials [tokens, w_rows + pad] f32     (double-buffered, or none)
//   full[stages], empty[stages], ready[2], freed[2] mbarriers
// x_rows: the activation tile's rows, the token tile (the weight as wgmma's A) or
// 64 (the wide kernels: the activations as A, rows past m zero).
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

// w_rows weight rows per stage (and per unit: the partials' rows).
constexpr Layout layout_rows(int w_rows, int tokens, int stages, int x_rows, int partial_buffers) {
  Layout l;
  l.w_bytes = w_rows * kChunkK * 2;  // a multiple of 1024: rows are a multiple of 8
  l.x_bytes = x_rows * kChunkK * 2;
  l.stage_bytes = l.w_bytes + l.x_bytes;
  l.stages = stages;
  l.partial_stride = w_rows + kPartialPad;
  l.partial_bytes = tokens * l.partial_stride * 4;
  l.partials_offset = stages * l.stage_bytes;
  l.barriers_offset = l.partials_offset + partial_buffers * l.partial_bytes;
  l.bytes = l.barriers_offset + (2 * stages + 4) * 8;
  l.smem_bytes = l.bytes + kAlign;
  return l;
}

// The weight-as-A kernels: sub_tiles 64-row tiles, a [tokens, 64] activation tile.
constexpr Layout layout(int sub_tiles, int tokens, int stages) {
  return layout_rows(sub_tiles * kTileRows, tokens, stages, tokens, 2);
}

// The deepest ring whose layout_of(stages) fits `budget` bytes of shared memory (0
// where not even kMinStages fit).
template <class LayoutOf>
constexpr int deepest_ring(LayoutOf layout_of, int budget) {
  int stages = 0;
  while (stages < kMaxStages && layout_of(stages + 1).smem_bytes <= budget) ++stages;
  return stages >= kMinStages ? stages : 0;
}
constexpr int stages_within(int sub_tiles, int tokens, int budget) {
  return deepest_ring([=](int stages) { return layout(sub_tiles, tokens, stages); }, budget);
}

// ---- The wide kernels: the weight tile as wgmma's B ----------------------------
// A block of `rows` weight rows (128 to 256, a multiple of 32) is one wgmma's N; the
// activations, padded to 64 rows, are its A: one instruction covers every token of
// the block, so a CTA streams 64 / rows bytes of x per weight byte (the weight as A
// streams tokens / 64 per 64-row tile), and the block sizes let a shape's blocks fill
// the SMs in one wave (20480 rows: 128 blocks of 160). One accumulator chain of
// rows / 2 registers per thread holds the k16 steps in order: another summation
// order than the weight-as-A kernels' four chains. One kernel per block size for
// 17-64 rows (partials sized for 64 tokens; at 16 rows and fewer the weight as A
// reads little x). Split-K partials only where split > 1.
inline constexpr std::array<int, 5> kWideRows = {128, 160, 192, 224, 256};
constexpr bool wide_shape_built(int rows) {
  for (int r : kWideRows)
    if (r == rows) return true;
  return false;
}
constexpr Layout wide_layout(int rows, int stages, int split) {
  return layout_rows(rows, kMaxTokens, stages, kTileRows, split > 1 ? 2 : 0);
}
constexpr int wide_stages_within(int rows, int split, int budget) {
  return deepest_ring([=](int stages) { return wide_layout(rows, stages, split); }, budget);
}

// The token tile for m rows (1 <= m <= kMaxTokens).
constexpr int token_tile(int m) { return m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : 64; }

// The (sub-tiles, token tile) kernels built: 4 accumulator chains x sub-tiles x
// tokens / 2 registers per thread, at most 128.
constexpr bool shape_built(int sub_tiles, int tokens) {
  return (sub_tiles == 1 || sub_tiles == 2 || sub_tiles == 4) &&
         (tokens == 8 || tokens == 16 || tokens == 32 || tokens == 64) && sub_tiles * tokens <= 64;
}

// The weight producer's cap on stages in flight (InFlightCap in wgmma_tiles.cuh):
// before it issues its use `issued` of the ring (counted from 0), it waits until use
// issued - cap has landed, on that stage's landed barrier at the parity of that use
// (use n of a stage is its barrier's phase n / stages). With cap <= stages the
// barrier has not been armed for a later use yet (that is use issued - cap +
// stages >= issued), so the parity names this use. No wait for the first cap uses.
// The cap may change from one use to the next (each wait is on an earlier use).
struct LandedWait {
  bool wait = false;
  int stage = 0;
  uint32_t parity = 0;
};
constexpr LandedWait landed_wait(int issued, int cap, int stages) {
  if (issued < cap) return {};
  const int n = issued - cap;
  return {true, n % stages, static_cast<uint32_t>(n / stages) & 1u};
}

}  // namespace tpdecode::wgmma
