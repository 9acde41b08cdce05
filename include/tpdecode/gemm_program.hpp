// GemmProgram: a chain of decode GEMMs and RMSNorms run as one persistent kernel.
// A GEMM op is out[m, n] = x[m, k] W[n, k]^T (BF16 operands, FP32 accumulation, one
// BF16 rounding), a Norm op a row-wise RMSNorm (with a residual add) of k columns,
// on buffers fixed when the program is built. An op's x is either an
// input of the program or a column window of an earlier op's out (`after`); one
// CTA per SM runs every op in order, the weights of the next ops stream while an
// op finishes, and an op's math waits only for the outputs it reads, each value
// as it arrives. Results are bitwise identical from run to run (a fixed plan;
// a split block's K parts summed in one fixed order; no atomics in sums).
//
// The kernel needs every SM of the device at once (its CTAs wait on each other):
// run it on a GPU that no concurrent kernel holds for good (a CTA that cannot
// become resident makes the others' waits trap after 10 s). Buffers: outs may not
// overlap each other (disjoint column windows of one buffer do not) nor any input
// x; nothing else may read or write an out while the program runs (the program
// reads an earlier op's outputs from its own copy, so the out buffers are written
// for the caller only). One program object runs one
// call at a time: its counters, scratch and mailbox are its own, so do not run it
// on two streams at once, and every kernel launched between two of its runs must
// complete before the second starts (a kernel with programmatic dependent launch
// that never waits for its predecessor would let the runs overlap).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "tpdecode/tensor.hpp"

namespace tpdecode {

namespace program {
struct TeamBinding;  // a TeamProgram's rank (private to the library)
}

class GemmProgram {
 public:
  // What an op stores as its out.
  enum class Epilogue {
    kPlain,  // out[m, n] = x W^T, rounded to BF16
    // An MLP's gate_up with its SiLU-mul: the weight's rows are n/2 gate rows, then
    // n/2 up rows; out[m, n/2] = silu(gate) * up of the BF16-rounded products, as the
    // SiLU-mul kernel computes it from a stored gate_up (core/silu_mul.cuh).
    // The program packs each gate row next to its up row, so one epilogue holds both:
    // nothing else reads gate_up, and a later op (the down projection) reads the
    // activation like any out.
    kSiluMul,
  };
  struct Gemm {
    TensorView weight;  // [n, k] bf16, contiguous, 16-byte aligned, k a multiple of 64
    TensorView x;       // [m, k] bf16, 16-byte aligned rows
    TensorView out;     // [m, n] bf16 (any row stride >= n); [m, n / 2] with Epilogue::kSiluMul
    // -1: x is an input of the program. Else the earlier op whose out x is a window
    // of: its rows and row stride, columns [c, c + k) with c a multiple of 8.
    int after = -1;
    Epilogue epilogue = Epilogue::kPlain;
  };
  // An RMSNorm op (at TP 1 the drafter's residual add + norm, and its q_a / kv norms):
  // h = x, or with a residual h = bf16(x + residual), stored to residual_out where
  // given; out = bf16((h * rstd) * weight) per row with rstd = 1 / sqrt(sum(h^2) / k +
  // eps). Every SM takes a share of the columns; the row's sum of squares is the
  // SMs' sums of their shares added in a fixed order (reference/program_norm.hpp):
  // the same bits from run to run, other bits than a norm kernel's order gives.
  // Served while rows x ceil(k / 8 / CTAs) <= 512 (k 7168 on 132 SMs: every row count;
  // in a TeamProgram of 8 ranks on one H200, 16 CTAs each: up to 9 rows); else the
  // program is Unavailable.
  struct Norm {
    TensorView x;  // [m, k] bf16, k a multiple of 8, 16-byte aligned rows
    int after = -1;  // as Gemm::after
    TensorView weight;  // [1, k] bf16, 16-byte aligned
    float eps = 1e-6f;
    // None (null data), an input [m, k] (16-byte aligned rows) that no op writes, or
    // an earlier Norm's residual_out (the residual stream of a layer's two norms).
    TensorView residual;
    // None (null data) or [m, k] (16-byte aligned rows): h (x itself without a
    // residual: a residual stream's start). May be `residual` itself (in place: each
    // value is read, then written, by one thread).
    TensorView residual_out;
    TensorView out;  // [m, k] bf16, 16-byte aligned rows
    // Folded into the GEMMs that read out (out is then not written; the other fields
    // as above): x's producer, a plain GEMM, adds the residual in its epilogue (h
    // stored to residual_out, the bits this op would store) and publishes each 64-row
    // block's per-row sum of squares of h with it; every GEMM reading out multiplies
    // h by a weight with `weight` folded in (W[:, c] * weight[c], rounded to BF16 once
    // when the program is built) and its FP32 sums by the row's rstd (the blocks' sums
    // added in a fixed order) before its one rounding. No stage of the program waits
    // for the norm; the reader's out differs from the unfolded one's by the roundings
    // moved (no bf16(h * rstd * weight) in between; the tests hold it to the exact
    // norm's FP64 product). Requires: x a window of a plain GEMM's out from a
    // multiple of 64 columns, k a multiple of 64 or reaching that out's end; with a
    // residual or residual_out, x all of that GEMM's out and no other op reading it;
    // the residual an input or an earlier folded norm's residual_out; every op
    // reading out a GEMM.
    bool folded = false;
    // x is this rank's partial (a row-parallel GEMM's out): the op first sums every
    // rank's x, FP32 in rank order from rank 0's, rounded once to BF16 (the one-shot
    // all-reduce's bits: reference/all_reduce.hpp), then adds the residual and
    // normalises as above. Served in a TeamProgram (team_program.hpp) only; not with
    // `folded`.
    bool all_reduce = false;
  };
  struct Op {
    Op(const Gemm& g) : gemm(g) {}  // NOLINT: implicit, so a list of Gemm is a list of Op
    Op(const Norm& n) : is_norm(true), norm(n) {}  // NOLINT
    bool is_norm = false;
    Gemm gemm;
    Norm norm;
  };
  static constexpr int kMaxRows = 64;
  // Whether a folded norm's x may be columns [column, column + k) of its producer's
  // out of n columns (Norm::folded): from a multiple of 64, a multiple of 64 wide or
  // reaching the out's end (the producer publishes row sums per 64-column block).
  static constexpr bool folds_window(int64_t column, int64_t k, int64_t n) {
    return column % 64 == 0 && (k % 64 == 0 || column + k == n);
  }

  // Where a run's time went, per CTA (a diagnostic: record_timeline below). Times
  // are the GPU's global timer in ns; 0 where the CTA has no unit of the op.
  struct OpTimes {
    uint64_t start_ns = 0;         // the CTA's first stage of the op is full (weights and x landed)
    uint64_t mma_end_ns = 0;       // its last MMA of the op completed
    uint64_t epilogue_end_ns = 0;  // its last unit of the op stored (and published) its outputs
    // How long the CTA's weight producer, issuing the op's weights, waited for a
    // free ring stage (the math behind: the stream stopped) and for its cap on the
    // bytes in flight (the stream's own pace).
    uint64_t ring_full_ns = 0;
    uint64_t capped_ns = 0;
  };
  struct RunTimeline {
    std::vector<uint32_t> sm;   // [ctas]: the SM each CTA ran on
    std::vector<OpTimes> ops;   // [ctas * ops()]: CTA c's op o at c * ops() + o
  };

  // Checks every op (InvalidArgument naming the op), plans the work for the
  // current device, packs a copy of every GEMM's weight in the kernel's tile order
  // (the program's own memory: those weights, and a folded norm's, are not read
  // again; a norm op reads its weight at every run) and uploads the plan. Host
  // only, before any capture; synchronises the device. The x and out buffers must
  // outlive the program. With record_timeline, every run also records its
  // RunTimeline (timelines(); 0.3-2 % slower).
  GemmProgram(std::vector<Op> ops, int m, bool record_timeline = false);
  ~GemmProgram();
  GemmProgram(const GemmProgram&) = delete;
  GemmProgram& operator=(const GemmProgram&) = delete;

  // Runs every op on `stream` (graph-capturable: a captured run replays on this
  // object's memory, so keep the object while the graph lives). With `pdl`, the
  // kernel may start during the previous kernel's tail (its weights stream at once;
  // its inputs are read after the previous kernel completes) and lets the next
  // kernel do the same.
  void run(cudaStream_t stream, bool pdl = true) const;

  int rows() const;
  int ops() const;
  int ctas() const;        // one per SM (in a TeamProgram, the SMs its rank owns)
  int ring_stages() const;
  int64_t bytes() const;   // of the GEMMs' weights (their packed copies are as large, plus padding to 64 rows)

  // The last runs' timelines (at most 8), oldest first; empty without
  // record_timeline. Synchronises the device.
  std::vector<RunTimeline> timelines() const;

 private:
  friend class TeamProgram;
  GemmProgram(std::vector<Op> ops, int m, bool record_timeline, const program::TeamBinding* team);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpdecode
