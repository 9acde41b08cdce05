// ArNorm: one-shot all-reduce of BF16 rows + residual add + RMSNorm in one kernel.
//
// One cluster of kArNormCtas (8) CTAs per row; CTA c owns columns
// [c·H/8, (c+1)·H/8), one 16-byte fragment (8 columns) per thread. Every rank
// pushes its partial into slot [rank] of every rank's mailbox (peer stores), polls
// its own TP slots, sums them in FP32 in rank order 0..TP-1 and rounds once to BF16
// (the all-reduce contract), adds the residual in FP32 and rounds once (the new
// residual), then normalises it: out = BF16(v · rstd · w), rstd = 1/sqrt(ss/H + eps).
// The reader re-arms its slots; call sites alternate the mailbox's two parities.
// Programmatic dependent launch: the weight loads before griddepcontrol.wait, no
// mailbox store precedes it; dependents are triggered at once with one rank per GPU,
// after the polls when ranks share a GPU (why: src/comm/ar_norm.cuh).
//
// Summation order of the row's sum of squares ss (the CPU reference,
// reference/ar_norm.hpp, follows it exactly):
//   1. thread: s = 0; for its 8 values v in column order: s = fma(v, v, s)
//      (threads past the CTA's fragments contribute s = 0);
//   2. warp: butterfly, for offset 16, 8, 4, 2, 1: s = s + s[lane ^ offset]; lane 0's;
//   3. CTA: w0 + w1, then + w2, + w3 ... in warp order;
//   4. cluster: the 8 CTA sums exchanged through distributed shared memory and
//      added in CTA order, (((c0 + c1) + c2) + ...) + c7, by every CTA alike.
// rstd is rounded correctly (__frsqrt_rn), so the output is bitwise equal to the
// reference wherever the host's correctly-rounded 1/sqrt agrees (it is computed in
// double and rounded to float: a double rounding that can differ by 1 FP32 ulp).
#pragma once

#include <cstdint>

#include "tpdecode/mailbox.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode {

inline constexpr int kArNormCtas = 8;  // CTAs per row (one cluster)

// Hidden sizes ArNorm is built for.
constexpr bool ar_norm_hidden_supported(int64_t hidden) {
  return hidden == 4096 || hidden == 5120 || hidden == 7168 || hidden == 8192;
}
// Fragments (16 B, 8 columns) per CTA, and threads per CTA (whole warps).
constexpr int ar_norm_frags_per_cta(int64_t hidden) { return static_cast<int>(hidden / (8 * kArNormCtas)); }
constexpr int ar_norm_threads(int64_t hidden) { return (ar_norm_frags_per_cta(hidden) + 31) / 32 * 32; }

// One call's tensors (all bf16, contiguous, rows 16-byte aligned).
struct ArNormIo {
  TensorView x;             // [rows, hidden]: this rank's partial
  TensorView residual;      // [rows, hidden], or data == nullptr: none (new residual = AR(x))
  TensorView weight;        // [1, hidden]: the RMSNorm weight
  float eps = 1e-6f;
  TensorView out;           // [rows, hidden]: RMSNorm(new residual) · weight
  TensorView residual_out;  // [rows, hidden]: the new residual (may alias residual)
};

// The mailbox ArNorm uses is the all-reduce's: [2 parities, TP, rows_cap, hidden]
// bf16 (all_reduce_mailbox_shape).

// Rows one call can take on this rank's GPU: every rank on the device must hold
// its 8·rows CTAs at once (the local team at TP 8 on 132 SMs: about 32).
int ar_norm_max_resident_rows(const RankContext& ctx, int64_t hidden);

// Driven rank `ctx`, mailbox parity `box`. Throws InvalidArgument (shapes, hidden
// not supported), CapacityError (rows above the mailbox or above what the ranks on
// this GPU can hold at once), TimeoutError (an earlier call timed out: reset()).
void ar_norm(const RankContext& ctx, const Mailbox::View& box, const ArNormIo& io);

}  // namespace tpdecode
