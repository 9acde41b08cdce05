// The work plan of a GEMM program (gemm_program.hpp), shared by the host (which
// builds it once) and the kernel (program_kernel.cu, which follows it): every op's
// [64-row block, K step] grid of work cut into equal contiguous shares, one per
// CTA, in op order. A block whose K steps fall to several CTAs is completed by the
// one holding its first steps (part 0): part 0 plus the sum of parts 1, 2, ... in
// that order, bitwise the same every run.
#pragma once

#include <cstdint>
#include <vector>

namespace tpdecode::program {

inline constexpr int kBlockRows = 64;  // weight rows of one work block (one wgmma tile)

// What the plan needs of one op: a GEMM, out[m, n] = x[m, k] W[n, k]^T, or an
// RMSNorm of k columns (n == k), which has no GEMM work: every CTA normalises its
// share of the columns (norm_share) and counts once when its share is published.
struct OpShape {
  int64_t n = 0;
  int64_t k = 0;  // a multiple of 64 (a GEMM), of 8 (a norm)
  bool norm = false;
  // A folded norm: no work, no stats, nothing published (its producer and readers
  // do its work). A GEMM producing a folded norm's x: its blocks' row sums of squares.
  bool folded = false;
  bool row_stats = false;
};

// One CTA's K steps [step_begin, step_end) of one block of one op. parts > 1: the
// block's partial sums meet in scratch (parts slots of [m, 64] f32 from `scratch`,
// slot `part` this unit's; part 0's slot is never written: the finisher sums the
// others, part 0 adds its own).
struct Unit {
  int32_t op = 0;
  int32_t block = 0;
  int32_t step_begin = 0;
  int32_t step_end = 0;
  int32_t part = 0;
  int32_t parts = 1;
  int64_t scratch = 0;  // floats
};

struct Plan {
  std::vector<Unit> units;            // CTA c's units: [cta_begin[c], cta_begin[c + 1]), in op order
  std::vector<int32_t> cta_begin;     // [ctas + 1]
  std::vector<int32_t> blocks;        // per op: blocks, or CTAs for a norm (what its completion counter reaches)
  int64_t scratch_floats = 0;
  int32_t max_parts = 0;
};

// A bf16 matrix in device memory, as the checks see it (addresses, elements).
struct Matrix {
  uintptr_t data = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // elements
};

// An op's x and out, and the op whose out x is a window of (-1: x is an input of
// the program, read from memory).
struct OpBuffers {
  Matrix x;
  Matrix out;
  int after = -1;
  // A norm's residual: an input (none: data 0), or residual_after's residual_out;
  // where it stores x + residual (none: data 0). The residual_out may be its own
  // residual (in place: each value is read, then written, by one thread).
  Matrix residual;
  int residual_after = -1;
  Matrix residual_out;
  bool folded = false;  // a folded norm: its out is not written (readers' windows only)
};

// InvalidArgument where the ops cannot run as one program: an x of op `after` that
// is not a window of its out (the same rows and row stride, columns from a multiple
// of 8 inside it), outs (residual_outs too) that share a byte (disjoint column
// windows of one buffer do not), or an out over an input x or residual (the inputs
// are read while ops write), but for a residual_out that is its own op's residual.
// The window's first column per op (0 for an input).
std::vector<int64_t> check_buffers(const std::vector<OpBuffers>& ops);

// Where the ops that other ops read publish their outputs (the program's mailbox):
// per op, its [m, stride] bf16 region in each of the two epochs (offset -1: no op
// reads it); per norm op (not folded), the CTAs' sums of squares of their shares,
// [m, stats_stride] f32 from stats; per GEMM with row_stats, its blocks' row sums
// of squares, [m, row_stats_stride(n)] f32 from stats (elements; -1: none).
// Regions are 16-byte aligned and disjoint; an epoch is `epoch_elements`.
struct MailboxLayout {
  std::vector<int64_t> offset;  // elements into an epoch
  std::vector<int64_t> stride;  // elements per row, n rounded up to 8
  std::vector<int64_t> stats;   // elements into an epoch
  int64_t stats_stride = 0;     // floats per row of a norm's stats: the CTAs rounded up to 4
  int64_t epoch_elements = 0;   // a multiple of 8
};
// Floats per row of a GEMM's row stats: its 64-row blocks rounded up to 4.
inline int64_t row_stats_stride(int64_t n) { return ((n + kBlockRows - 1) / kBlockRows + 3) / 4 * 4; }
MailboxLayout mailbox_layout(const std::vector<OpShape>& ops, const std::vector<int>& after, int m, int ctas);

// K steps of an op at `depth` chunks of 64 columns per step.
int64_t steps_of(const OpShape& op, int depth);

// The largest row count times 16-byte pieces per CTA's share that a norm serves (its
// finisher threads hold at most 4 pieces each).
inline constexpr int64_t kNormMaxItems = 4 * 128;

// The plan for `ctas` CTAs, m rows, `depth` chunks per K step.
Plan plan_program(const std::vector<OpShape>& ops, int ctas, int m, int depth);

}  // namespace tpdecode::program
