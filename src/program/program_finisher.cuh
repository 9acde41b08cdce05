// The GEMM program's finisher warps: the work of a block's completion that waits on
// global memory, taken off the consumer warpgroup, whose next MMAs would otherwise
// wait behind it. Each wait is an L2 round trip, which the weight stream makes
// about 3 us long (a device trace of the program: part 0 spent ~3 us loading the
// other parts' partials, written microseconds before, and ~1 us in the release of
// its count, per op and CTA). The finisher walks the CTA's units in order:
//  - for part 0 of a split block (its CTA's last unit of the op): the other parts'
//    partials summed in order 1, 2, ..., parts-1 into shared memory (`pre`), each
//    value polled until written (from the end of the previous sum, so often ops
//    ahead of part 0) and its slot emptied for the next run; the consumers add
//    part 0 to that sum.
//  - for every norm op, at its place in op order (after the CTA's last unit where
//    no op reads it: OpDesc::deferred): the CTA's share of it (program_norm.cuh),
//    with every finisher thread;
//  - for every block an op reads, once the consumers have stored and published it:
//    the count in op_done by the finisher's thread 0 (count_published: relaxed, or
//    with release, cumulative: the consumers' stores precede its wait on their
//    arrival). A release waits for the SM's outstanding traffic (~1 us), which would
//    hold warp 0's next sum: so up to 6 rows warp 0 does not sum (summing_warps);
//    from 7 rows it does, as a counting warp of its own (3 summing) measured slower
//    above 16 tokens (docs/performance.md).
#pragma once

#include <cuda/atomic>

#include <cstdint>

#include "core/device.cuh"
#include "program/program_activations.cuh"
#include "program/program_launch.hpp"
#include "program/program_fold.cuh"
#include "program/program_norm.cuh"
#include "program/program_protocol.hpp"

namespace tpdecode::program {

// The kernel's warps: the consumer warpgroup, the weight producer's warp, the
// activation loaders, the finisher's warps. The SM's quarters hold 3 warps each at
// 168 registers, with 9 warps or 12; one finisher warp ran 64 tokens 1.7x slower
// (a part of 64 tokens is 8 batches of one warp's loads), 3 summing warps 1.2x.
inline constexpr int kFinisherWarps = 4;
inline constexpr int kFinisherWarp = wgmma::kWeightWarp + 1 + kLoaderWarps;  // the first
inline constexpr int kFinisherThreads = 32 * kFinisherWarps;
inline constexpr int kProgramThreads = 32 * kFinisherWarp + kFinisherThreads;
// The named barrier of the consumers and the finisher at the end (this kernel uses
// no other named barrier).
inline constexpr int kFinishBarrier = 1;

// A partial-sum slot no part has written: a NaN pattern no part stores (a partial
// of these bits is stored as 0x7fffffff, a NaN too).
inline constexpr uint32_t kEmptyPartial = 0xffffffffu;
static_assert(kEmptyPartial == kEmptyWord, "has_empty tests both");

// A warp's arrival on a handoff barrier once its lanes' accesses are done: lane 0's
// after __syncwarp (which orders them before it), kArrivalsPerWarp = 1. One per thread
// measured 5 % slower at TP 8 M 1; a racecheck build arrives so
// (-DTPDECODE_RACECHECK_ARRIVALS, kArrivalsPerWarp = 32): racecheck reports the
// per-warp form as a race on a correct minimal kernel too (docs/performance.md, Known
// issues), so that build's reports are the other forms'.
#ifdef TPDECODE_RACECHECK_ARRIVALS
inline constexpr int kArrivalsPerWarp = 32;
#else
inline constexpr int kArrivalsPerWarp = 1;
#endif
__device__ __forceinline__ bool arrives_for_warp(int lane) {
  __syncwarp();
  return kArrivalsPerWarp == 32 || lane == 0;
}

// The finisher's shared memory with the consumers: the sum of a split block's
// parts 1 .. parts-1 ([tokens][64] floats), an op's prologue (the rows' rstd of a
// GEMM reading a folded norm, [tokens] floats) and three barrier pairs, full and
// empty: pre (the finisher fills, the consumers take), published (the consumers
// arrive once a block they publish is stored, the finisher counts it) and prologue
// (the finisher fills before the CTA's first unit of an op that has one, the
// consumers release it after their last). And the consumers' own: a block's row
// sums of squares ([2][4][tokens] floats, program_fold.cuh).
struct Handoff {
  float* pre;
  // Per warp: kArrivalsPerWarp (arrives_for_warp).
  uint64_t* pre_full;   // the finisher's warps
  uint64_t* pre_empty;  // the consumer warps
  uint64_t* pub_full;   // the consumer warps, after their stores
  uint64_t* pub_empty;  // 1 arrival: the finisher's thread 0
  uint64_t* prologue_full;   // 1 arrival: the finisher's thread 0
  uint64_t* prologue_empty;  // the consumer warps
  float* rstd;
  float* row_sums;
};
inline constexpr int kHandoffBarriers = 6;
// The handoff's floats past its barriers at `tokens` per tile: pre, rstd, the row sums.
__host__ __device__ constexpr int handoff_floats(int tokens) { return tokens * kBlockRows + tokens + 8 * tokens; }

// The phases a role has waited for on the handoff's barriers (row_sums: the
// consumers' buffer of the next block's sums).
struct HandoffPhases {
  uint32_t pre = 0;
  uint32_t pub = 0;
  uint32_t prologue = 0;
  uint32_t row_sums = 0;
};

// Whether the CTA's units of a GEMM op wait for a prologue from the finisher: its
// rows' rstd (it reads a folded norm), or a residual stream another CTA wrote in place
// (its count acquired before the op stores over it).
__device__ __forceinline__ bool has_prologue(const OpDesc& op) {
  return op.norm == 0 && (op.rstd_stats >= 0 || op.residual_after_op >= 0);
}

// The finisher's warps that sum at m rows: the last ones, as many as a part's
// 16-byte pieces need (warp 0, whose thread 0 counts, only from 7 rows), so that a
// count's release does not hold the sum at few rows.
__device__ __forceinline__ int summing_warps(int m) {
  return min(kFinisherWarps, (m * kBlockRows / 4 + 31) / 32);
}

// Whether the finisher counts unit u's block once it is published.
__device__ __forceinline__ bool counted(const Args& a, const Unit& u) {
  return protocol::counted(u, a.ops[u.op].out_mailbox >= 0);
}

template <bool kTeam>  // the kernel serves team ops (NormShare)
struct Finisher {
  // 16-byte loads a lane keeps in flight. Why 4: the program's TP 8 chain took
  // 5-9 % less with 8 than with 16 at M 1 / 8 / 28 (TP 4 4-6 %), and 1-2 % less
  // again with 4 (two runs each, one call per pair; docs/performance.md): the polls'
  // loads compete less with the weight stream.
  static constexpr int kBatch = 4;

  const Args& a;
  const CtaUnits& units;
  const Handoff& h;
  int thread;  // of the finisher's threads

  // pre = parts 1, 2, ..., parts-1 of unit u's block, summed in that order: thread
  // t owns the 16-byte pieces t, t + kFinisherThreads, ... of a part's m x 64 floats
  // and walks (part, piece) in part order, kBatch loads in flight.
  __device__ void sum_other_parts(const Unit& u) const {
    const int pieces = a.m * kBlockRows / 4;
    const int first_piece = kFinisherThreads - 1 - thread;  // from the last warp
    const int mine = (pieces - first_piece + kFinisherThreads - 1) / kFinisherThreads;  // per part
    const int total = (u.parts - 1) * mine;
    auto piece = [&](int e) { return first_piece + kFinisherThreads * (e % mine); };
    auto src = [&](int e) {
      const int first = 4 * piece(e);  // of the part's [m, 64] floats
      return reinterpret_cast<uint32_t*>(a.scratch) +
             protocol::part_element(u.scratch, 1 + e / mine, a.m, first / kBlockRows, first % kBlockRows);
    };
    for (int first = 0; first < total; first += kBatch) {
      uint4 v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (first + j < total) v[j] = load_relaxed16(src(first + j));
      poll_until_published(v, [&](int j) { return first + j < total; }, [&](int j) { return src(first + j); });
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int e = first + j;
        if (e >= total) break;
        float4* to = reinterpret_cast<float4*>(h.pre) + piece(e);
        const float4 f = {__uint_as_float(v[j].x), __uint_as_float(v[j].y), __uint_as_float(v[j].z),
                          __uint_as_float(v[j].w)};
        if (e < mine) {
          *to = f;
        } else {
          const float4 s = *to;
          *to = float4{s.x + f.x, s.y + f.y, s.z + f.z, s.w + f.w};
        }
        store_relaxed16(src(e), uint4{kEmptyPartial, kEmptyPartial, kEmptyPartial, kEmptyPartial});
      }
    }
  }

  // The CTA's shares of the norm ops before op `op` not yet run (from `next`), each
  // once the consumers have taken pre's last sum (the share's shared memory). Why the
  // barrier first: threads that do not sum (from 1 to 6 rows) run ahead of the
  // summing warps' fills, and a parity wait on pre_empty can tell only the last
  // phase from the one before it (a step-1 drafter run at one row read sums a share
  // had overwritten).
  __device__ void norms_before(int op, int& next, const HandoffPhases& ph, uint32_t epoch) const {
    for (; next < op; ++next)  // not a GEMM, a folded norm (no work of its own) or a deferred one
      if (a.ops[next].norm == 1 && a.ops[next].deferred == 0) norm_share(next, ph, epoch);
  }
  __device__ void norm_share(int op, const HandoffPhases& ph, uint32_t epoch) const {
    dev::named_barrier_sync(kNormBarrier, kFinisherThreads);
    dev::mbar_wait(h.pre_empty, ph.pre ^ 1);
    NormShare<kFinisherThreads, kTeam>{a, a.ops[op], h.pre, a.mailbox + epoch * a.epoch_words, thread}.run(op);
  }

  // The prologue of op `op` (has_prologue), before the CTA's first unit of it: once
  // the consumers released the last one and took pre's last sum (pre holds rstd's
  // partial sums meanwhile).
  __device__ void prologue(const OpDesc& op, HandoffPhases& ph, uint32_t epoch) const {
    dev::named_barrier_sync(kNormBarrier, kFinisherThreads);  // as norms_before: why
    dev::mbar_wait(h.pre_empty, ph.pre ^ 1);
    dev::mbar_wait(h.prologue_empty, ph.prologue ^ 1);
    if (op.residual_after_op >= 0 && thread == 0) wait_complete(a, op.residual_after_op);
    if (op.rstd_stats >= 0)
      FoldedRstd<kFinisherThreads>{a, op, h.pre, h.rstd, a.mailbox + epoch * a.epoch_words, thread}.run();
    dev::named_barrier_sync(kNormBarrier, kFinisherThreads);
    if (thread == 0) dev::mbar_arrive(h.prologue_full);
    ph.prologue ^= 1;
  }

  __device__ void run(uint32_t epoch) const {
    HandoffPhases ph;
    const bool sums = thread / 32 >= kFinisherWarps - summing_warps(a.m);
    int next_norm = 0;
    for (int j = 0; j < units.count(); ++j) {
      const Unit& u = units[j];
      norms_before(u.op, next_norm, ph, epoch);
      if (units.opens_op(j) && has_prologue(a.ops[u.op])) prologue(a.ops[u.op], ph, epoch);
      if (protocol::finisher_sums(u)) {
        if (sums) {
          dev::mbar_wait(h.pre_empty, ph.pre ^ 1);
          sum_other_parts(u);
          if (arrives_for_warp(thread % 32)) dev::mbar_arrive(h.pre_full);
        }
        ph.pre ^= 1;  // every finisher thread: a norm share waits for pre's last sum to be taken
      }
      if (thread == 0 && counted(a, u)) {
        dev::mbar_wait(h.pub_full, ph.pub);
        count_published(a, u.op);
        dev::mbar_arrive(h.pub_empty);
        ph.pub ^= 1;
      }
    }
    norms_before(a.op_count, next_norm, ph, epoch);
    for (int o = 0; o < a.op_count; ++o)
      if (a.ops[o].norm == 1 && a.ops[o].deferred != 0) norm_share(o, ph, epoch);
  }
};

}  // namespace tpdecode::program
