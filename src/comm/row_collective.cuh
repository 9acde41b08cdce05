// The per-row body of the one-shot mailbox collectives that end in a row epilogue:
// ArNorm (ar_norm.cu) and the o-projection's consumers (src/oproj). One cluster of
// kArNormCtas CTAs per row, launched as grid (kArNormCtas, ...), thread t of CTA c
// owning fragment c · hidden/64 + t (threads past it hold nothing). The all-reduce
// is collectives.hpp's one-shot; the epilogue receives the rank-order sum.
//
// An epilogue provides, for its thread's fragment:
//   load_params(frag, active)                 before griddepcontrol.wait (weights)
//   load_inputs(row, at, active)              after it, overlapping the entry
//   finish(sum, ok, row, at, frag, active)    every thread (cluster sums inside);
//                                             ok false: the call failed, poison
// where `at` is the fragment's index in a [rows, hidden] tensor.
//
// Programmatic dependent launch. A call that pushes (x set) reads x and stores into
// the mailbox only after griddepcontrol.wait. A consumer of the o-projection does
// not push: its producer kernel (the previous one in the stream) did, and lets it
// launch only once every producer CTA is past its own griddepcontrol.wait, so
// every kernel before the producer has completed (each of them waits for its own
// predecessor before it completes). `early`: such a consumer reads its inputs and
// polls at once, overlapping the producer's GEMM, and waits for the producer's
// completion only at its end (so that its own completion still implies its
// predecessor's, which the reasoning above relies on for the next call). Its entry
// then reads the epoch the previous call advanced (that call completed before the
// producer got past its wait) and which no kernel of this call changes before
// this consumer's last CTA (the producer only reads it).
#pragma once

#include "comm/collectives.hpp"
#include "comm/row_norm.cuh"
#include "tpdecode/device.cuh"

namespace tpdecode {

// Why references: to the kernel's parameters, which stay in parameter space (a
// copy would go to local memory: the peers' addresses are indexed at run time).
struct RowCall {
  const lamport::TeamRef& team;
  const lamport::MailboxRef& box;  // [parities, TP, rows_cap, >= hidden · 2 bytes]
  lamport::Op op;
  const void* x;       // [rows, hidden] bf16 to push, or nullptr: a producer kernel pushed it
  int hidden;
  bool trigger_early;  // launch dependents at entry (one rank per GPU), else after the polls
  bool early;          // see above: only for a consumer launched by its producer (x null)
  bool system_fence;   // CommConfig::system_fence: a fence.acq_rel.sys before the pushes
};

// Every thread of the row's cluster calls it; the CTAs of the launch that take
// tickets (every CTA: gridDim.x · gridDim.y) advance the epoch together.
template <int kRanks, class Epilogue>
__device__ __forceinline__ void row_collective(const RowCall& c, Epilogue& epi, int row) {
  using namespace lamport;
  __shared__ uint32_t entry;
  rownorm::cluster_arrive_started();
  const int frags_per_cta = c.hidden / (8 * kArNormCtas);
  const bool active = static_cast<int>(threadIdx.x) < frags_per_cta;
  const int frag = static_cast<int>(blockIdx.x) * frags_per_cta + static_cast<int>(threadIdx.x);
  const long at = static_cast<long>(row) * (c.hidden / 8) + frag;
  // Why before the wait: parameters, not outputs of the previous kernel; their
  // loads overlap that kernel's tail.
  epi.load_params(frag, active);
  if (c.trigger_early) dev::pdl_launch_dependents();
  if (!c.early) dev::pdl_wait();
  // Why before the entry: the inputs' loads and the entry's round trip overlap.
  Fragment mine{};
  if (active && c.x) mine = static_cast<const Fragment*>(c.x)[at];
  epi.load_inputs(row, at, active);
  Memory mem(c.team.timeout_ns);
  uint32_t epoch = 0;
  if (threadIdx.x == 0) entry = begin(mem, c.team, c.box, c.op, &epoch);
  __syncthreads();
  bool ok = entry != kAbortedEntry;
  uint32_t ticket = 0;  // thread 0's arrival, read at the end (its wait off the row's path)
  Fragment sum{};
  if (active && ok) {
    const Call call{c.op, static_cast<int>(entry)};
    if (c.x) {
      if (c.system_fence) dev::fence_acq_rel_sys();
      one_shot_push<kRanks>(mem, c.team, c.box, call, row, frag, mine);
    }
    ticket = threadIdx.x == 0 ? take_ticket(mem, c.team, c.box) : 0u;
    ok = one_shot_poll_sum<kRanks>(mem, c.team, c.box, call, row, frag, &sum);
  }
  const bool rearm = active && ok;
  // Why late with several ranks on one GPU: a dependent grid launched early could
  // hold SM slots that a peer's grid of this call still needs (all_reduce.cu).
  if (!c.trigger_early) dev::pdl_launch_dependents();
  epi.finish(sum, ok, row, at, frag, active);
  // Why after the epilogue: its cluster barrier's fence waits for the thread's
  // outstanding global stores; the re-arm only has to precede the call's end.
  if (rearm) one_shot_rearm<kRanks>(mem, c.team, c.box, Call{c.op, static_cast<int>(entry)}, row, frag);
  if (threadIdx.x == 0 && entry != kAbortedEntry)
    advance_if_last(mem, c.team, c.box, epoch, ticket, gridDim.x * gridDim.y);
  if (c.early) dev::pdl_wait();
}

}  // namespace tpdecode
