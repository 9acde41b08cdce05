// The stream-K engine's plan, shared by the kernel (stream_k.cuh), the host rules
// (gemm_tactic.cpp) and the CPU tests: the shared-memory layout and the split of
// the work into equal parts.
//
// Work. W is cut into tiles of 64 rows; a tile's K is cut into steps of 16 columns
// (one MMA). The (tile, step) pairs, tile-major, form one sequence of T * K/16
// steps; CTA c of G owns the contiguous range [T*S*c/G, T*S*(c+1)/G): every CTA
// streams the same number of bytes (to one step of 2 KB). A tile whose steps lie in
// one CTA's range is written by that CTA; a split tile's contributors are
// consecutive CTAs, each holding a partial sum over its part of K.
//
// Split tiles, without atomics in the sum: each contributor writes its FP32
// partial to a workspace slot, then counts itself on the tile's counter; the last
// to arrive sums every contributor's partial in CTA order (= K order), rounds once
// and resets the counter. The sum order depends only on (N, K, G): bitwise the same
// run to run whoever arrives last, and no CTA ever waits for another (safe when
// grids of several ranks share one GPU and not all CTAs are resident).
//   slot: 0 for the contributor's first tile, 1 for its last (a range has at most
//         two partial tiles, its ends);
//   counter: indexed by the tile's first contributor, which is first contributor
//         of no other split tile (its range ends inside this tile).
#pragma once

#include <cstdint>

#include "tpdecode/bf16.hpp"  // TPD_HD

namespace tpdecode::stream_k {

inline constexpr int kRows = 64;           // W rows per tile: four 16-row MMA tiles
inline constexpr int kStepCols = 16;       // K columns per step (one m16n8k16)
inline constexpr int kConsumerWarps = 4;   // split each stage's steps round robin
inline constexpr int kThreads = (kConsumerWarps + 1) * 32;  // + one producer warp
inline constexpr int kConsumerThreads = kConsumerWarps * 32;
inline constexpr int kMaxTokens = 32;
inline constexpr int kRowPadBytes = 16;    // row stride = 16 mod 128 bytes: conflict-free ldmatrix
inline constexpr int kRedStride = kRows + 4;  // [tokens, 68] floats: conflict-free fragment stores
inline constexpr int kMinStepsPerCta = 8;  // a CTA streams at least 16 KB (tiny weights: fewer CTAs)
inline constexpr int kPartialFloats = kMaxTokens * kRows;  // one workspace slot: [32 tokens, 64 rows]

// Shared memory of one CTA, in bytes from the dynamic base (16-byte aligned).
struct Layout {
  int row_bytes;      // one W or x row of a stage: 2 * stage_cols + 16
  int stage_w_bytes;  // [64 rows, row_bytes]
  int stage_x_bytes;  // [8 * token_tiles tokens, row_bytes]
  int full_off;       // [stages] mbarriers: the stage's copies landed
  int empty_off;      // [stages] mbarriers: every consumer warp is done reading the stage
  int flag_off;       // int: "this CTA reduces the split tile"
  int w_off;          // [stages] W stages
  int x_off;          // [stages] x stages
  int red_off;        // [8 * token_tiles, kRedStride] f32: the CTA's sum over its warps
  int total;
};

TPD_HD constexpr int align_up(int v, int a) { return (v + a - 1) / a * a; }

TPD_HD constexpr Layout layout(int token_tiles, int stage_cols, int stages) {
  Layout l{};
  l.row_bytes = 2 * stage_cols + kRowPadBytes;
  l.stage_w_bytes = kRows * l.row_bytes;
  l.stage_x_bytes = 8 * token_tiles * l.row_bytes;
  l.full_off = 0;
  l.empty_off = 8 * stages;
  l.flag_off = 16 * stages;
  l.w_off = align_up(l.flag_off + 4, 128);
  l.x_off = l.w_off + stages * l.stage_w_bytes;
  l.red_off = l.x_off + stages * l.stage_x_bytes;
  l.total = l.red_off + 8 * token_tiles * kRedStride * 4;
  return l;
}

// ---- The work split --------------------------------------------------------------
// First step of CTA c's range (c = ctas: the end). total * ctas stays below 2^63
// (stream_eligible bounds N * K).
TPD_HD int64_t range_begin(int64_t total, int ctas, int c) { return total * c / ctas; }
// The CTA whose range holds step `pos`: the largest c with range_begin(c) <= pos.
TPD_HD int cta_of(int64_t total, int ctas, int64_t pos) {
  const int64_t c = ((pos + 1) * ctas + total - 1) / total - 1;
  return static_cast<int>(c < ctas - 1 ? c : ctas - 1);
}

// The contributors of tile t: CTAs first..last (first == last: not split).
struct Contributors {
  int first, last;
};
TPD_HD Contributors contributors(int64_t total, int ctas, int64_t steps_per_tile, int64_t tile) {
  return {cta_of(total, ctas, tile * steps_per_tile), cta_of(total, ctas, (tile + 1) * steps_per_tile - 1)};
}
// Workspace slot of CTA c's partial of tile t: 0 for c's first tile, else 1.
TPD_HD int partial_slot(int64_t total, int ctas, int64_t steps_per_tile, int c, int64_t tile) {
  return range_begin(total, ctas, c) / steps_per_tile == tile ? 0 : 1;
}

// Walks a CTA's range as ring stages: each stage lies in one tile and holds at most
// `stage_steps` steps; stages restart at each tile boundary. The producer and the
// consumers walk the same sequence.
struct StageCursor {
  int64_t pos, end, steps_per_tile;
  int stage_steps;

  TPD_HD bool valid() const { return pos < end; }
  TPD_HD int64_t tile() const { return pos / steps_per_tile; }
  TPD_HD int64_t step() const { return pos - tile() * steps_per_tile; }  // first step, within the tile
  TPD_HD int64_t segment_end() const {
    const int64_t tile_end = (tile() + 1) * steps_per_tile;
    return end < tile_end ? end : tile_end;
  }
  TPD_HD int width() const {  // steps in this stage
    const int64_t left = segment_end() - pos;
    return static_cast<int>(left < stage_steps ? left : stage_steps);
  }
  // The last stage of this CTA's part of the tile: the tile's partial sum is complete.
  TPD_HD bool ends_segment() const { return pos + width() == segment_end(); }
  TPD_HD void next() { pos += width(); }
};

}  // namespace tpdecode::stream_k
