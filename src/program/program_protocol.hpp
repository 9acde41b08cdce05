// The GEMM program's protocol rules, shared by the kernel (program_kernel.cu,
// program_finisher.cuh, program_activations.cuh) and the CPU model that runs them
// under host threads with random delays (tests/cpu/program_protocol_test.cpp):
// which units the finisher completes and counts, when an op's outputs count as
// complete, the epochs, where values live in the mailbox and the scratch slots, and
// who resets the counters, and a norm op's shares and stats.
#pragma once

#include <cstdint>

#include "program/program_plan.hpp"

#if defined(__CUDACC__)
#define TPD_PROGRAM_HD __host__ __device__ __forceinline__
#else
#define TPD_PROGRAM_HD inline
#endif

namespace tpdecode::program::protocol {

// Part 0 of a split block: the finisher sums parts 1 .. parts-1 for it.
TPD_PROGRAM_HD bool finisher_sums(const Unit& u) { return u.part == 0 && u.parts > 1; }

// The unit that completes a block an op reads: its block is published, then
// counted in op_done (one count per block).
TPD_PROGRAM_HD bool counted(const Unit& u, bool read_by_an_op) { return u.part == 0 && read_by_an_op; }

// Whether a program of m rows counts relaxed and checks its loaders' copies (where
// no op stores over an op's outputs in place: OpDesc::count_release). Why up to 8
// rows: with the checks read from shared memory (ActivationLoader::check_copy) the
// TP 8 chain ran 4 % faster so at 8 rows (4-5 % at 1 row), but 4 % slower at 16 and
// 8 % at 28, where the copies find more words not yet published and poll them
// (docs/performance.md, "Chains").
// A test or measurement build may move the bound (-DTPDECODE_RELAXED_COUNT_ROWS=64).
#ifndef TPDECODE_RELAXED_COUNT_ROWS
#define TPDECODE_RELAXED_COUNT_ROWS 8
#endif
inline constexpr int kRelaxedCountRows = TPDECODE_RELAXED_COUNT_ROWS;
TPD_PROGRAM_HD bool relaxed_counts(int m) { return m <= kRelaxedCountRows; }

// An op's outputs are complete (every block published and counted).
TPD_PROGRAM_HD bool complete(uint32_t counted_blocks, int32_t blocks) {
  return counted_blocks >= static_cast<uint32_t>(blocks);
}

// The mailbox epoch a run publishes into, from the run counter: run r into r % 2;
// it empties the other, which run r + 1 publishes into.
TPD_PROGRAM_HD uint32_t publish_epoch(uint32_t runs) { return runs & 1u; }

// The CTA whose arrival (ctas_done before it) completes the run resets op_done and
// ctas_done and advances the run counter.
TPD_PROGRAM_HD bool last_to_finish(uint32_t before, uint32_t ctas) { return before == ctas - 1; }

// Element (bf16) of an epoch where an op publishes its output (token, row): the
// op's region from `offset`, rows of `stride` elements (mailbox_layout).
TPD_PROGRAM_HD int64_t mailbox_element(int64_t offset, int64_t stride, int token, int64_t row) {
  return offset + token * stride + row;
}

// Byte of a stage's x where 16-byte piece `piece` (of 8) of token t's 128 bytes in
// chunk d lives: the 128-byte swizzle wgmma reads (the piece XOR the token's row in 8).
TPD_PROGRAM_HD int x_piece_offset(int chunk_bytes, int chunk, int token, int piece) {
  return chunk * chunk_bytes + token * 128 + ((piece ^ (token % 8)) * 16);
}

// A checked copy's walk (ActivationLoader::check_copy): a lane takes piece lane % 8 of
// tokens lane / 8, lane / 8 + 4, ... in every chunk, copy_rows_per_lane(tokens) a
// chunk; its i-th piece is in chunk i / rows, at token lane / 8 + 4 (i % rows).
struct CopyPiece {
  int chunk;
  int token;
  int piece;
};
TPD_PROGRAM_HD constexpr int copy_rows_per_lane(int tokens) { return (tokens + 3) / 4; }
TPD_PROGRAM_HD CopyPiece copy_piece(int tokens, int lane, int i) {
  const int rows = copy_rows_per_lane(tokens);
  return {i / rows, lane / 8 + 4 * (i % rows), lane % 8};
}

// Float of the scratch where part p of a split block keeps (token, row): the
// block's parts' [m, 64] slots from u.scratch.
TPD_PROGRAM_HD int64_t part_element(int64_t scratch, int part, int m, int token, int row) {
  return scratch + (static_cast<int64_t>(part) * m + token) * kBlockRows + row;
}

// The pieces [begin, end) of the other epoch that CTA `cta` of `ctas` empties at
// the start of a run.
struct Range {
  int64_t begin;
  int64_t end;
};
TPD_PROGRAM_HD Range empty_share(int64_t pieces, int cta, int ctas) {
  return {pieces * cta / ctas, pieces * (cta + 1) / ctas};
}

// A norm op's share of CTA `cta`: its 16-byte pieces (8 columns each) [begin, end)
// of the k columns, the same for every norm of k columns (so a norm reads the
// residual_out of an earlier one where the same thread stored it).
TPD_PROGRAM_HD Range norm_share(int64_t k, int cta, int ctas) { return empty_share(k / 8, cta, ctas); }

// The 32-bit word of an epoch where CTA `cta` keeps the sum of squares of its share
// of token t's row (a norm's stats region from element `stats`, stride floats a row;
// the words past the CTAs are CTA 0's to store, as zeros).
TPD_PROGRAM_HD int64_t stats_word(int64_t stats, int64_t stride, int token, int cta) {
  return stats / 2 + token * stride + cta;
}

}  // namespace tpdecode::program::protocol
