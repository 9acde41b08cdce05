// The per-row body of the one-shot mailbox collectives that end in a row epilogue:
// ArNorm (ar_norm.cu) and the o-projection's consumers (src/oproj). One cluster of
// kArNormCtas CTAs per row, launched as grid (kArNormCtas, ...), thread t of CTA c
// owning fragment c · hidden/64 + t (threads past it hold nothing). The all-reduce
// is collectives.hpp's one-shot; the epilogue receives the rank-order sum.
//
// An epilogue provides, for its thread's fragment:
//   load_params(frag, active)                 before griddepcontrol.wait (weights)
//   load_inputs(row, at, active)              after it, overlapping the entry
//   finish(sum, ok, row, at, frag, active, after_barrier)
//                                             every thread (cluster sums inside);
//                                             ok false: the call failed, poison;
//                                             after_barrier() called once by every
//                                             thread right after a CTA-wide barrier
//                                             (the CTA's epoch ticket is taken there)
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
#include "comm/row_slots.hpp"
#include "core/device.cuh"

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
  bool clean_sum = false;  // CommConfig::batch_invariant: the sum cleaned as a mailbox would (the two-shot's bits)
};

// Every thread of the row's cluster calls it; the CTAs of the launch that take
// tickets (every CTA: gridDim.x · gridDim.y) advance the epoch together.
template <int kRanks, class Epilogue>
__device__ __forceinline__ void row_collective(const RowCall& c, Epilogue& epi, int row) {
  using namespace lamport;
  rownorm::cluster_start(epi);
  const int frags_per_cta = c.hidden / (8 * kArNormCtas);
  const bool active = static_cast<int>(threadIdx.x) < frags_per_cta;
  const int frag = static_cast<int>(blockIdx.x) * frags_per_cta + static_cast<int>(threadIdx.x);
  const long at = static_cast<long>(row) * (c.hidden / 8) + frag;
  // Why before the wait: parameters, not outputs of the previous kernel; their
  // loads overlap that kernel's tail.
  epi.load_params(frag, active);
  const RowSlots slots(c.team, c.box, row, frag);
  if (c.trigger_early) dev::pdl_launch_dependents();
  if (!c.early) dev::pdl_wait();
  // Why before the entry: the pushed fragment's load and the entry's round trip
  // overlap.
  Fragment mine{};
  if (active && c.x) mine = static_cast<const Fragment*>(c.x)[at];
  Memory mem(c.team.timeout_ns);
  // Every thread its own entry (begin(): the abort word and the epoch, one round
  // trip), no shared-memory broadcast and no barrier before the pushes. Why the
  // epoch is still the same in every thread of every CTA: only the call's last
  // CTA advances it, and a CTA's ticket is taken only after a CTA-wide barrier that
  // follows every one of its threads' entry (the epilogue's first row-sum barrier,
  // after_barrier below): bar.sync orders each thread's earlier loads before thread
  // 0's later ticket (and, in the hardware, a non-aborted active thread has used
  // its epoch before that barrier: the parity picks its push and poll addresses,
  // whose values feed the row sum). The last CTA's advance is issued only once its
  // ticket has returned the count of every other CTA's (it depends on the value),
  // so it follows every thread's epoch read of every CTA: none reads the advanced
  // epoch. A thread that saw the abort, or has no fragment, never uses its epoch
  // value (nothing to order).
  // An abort seen by some threads only: those poison their fragment (ok false: the
  // row's sum of squares and so every output of the row NaN, the residual poisoned)
  // and neither push nor poll; the others' polls stay bounded (the deadline, and
  // the abort word checked after kAbortCheckAfterNs), their pushes are late pushes
  // of an aborted team (protocol.hpp: Failure). The ticket follows thread 0's view
  // alone, as begin()'s single reader did: no ticket, no advance, as for a CTA that
  // saw the abort (the team needs a collective reset either way).
  uint32_t epoch = 0;
  const uint32_t entry = begin(mem, c.team, c.box, c.op, &epoch, false);
  // The abort recorded by one lane of each warp that saw it (a record is a
  // compare-and-swap on host-mapped memory; begin()'s single reader made one per
  // CTA): every rank with a poisoned row still has its record.
  const uint32_t saw_abort = __ballot_sync(0xffffffffu, entry == kAbortedEntry);
  if (saw_abort != 0 && static_cast<int>(threadIdx.x % 32) == __ffs(saw_abort) - 1)
    note_abort(mem, c.team, c.op, -1, mem.load_word(&c.team.own->abort), -1, -1);
  bool ok = entry != kAbortedEntry;
  uint32_t ticket = 0;  // thread 0's arrival, read at the end (its wait off the row's path)
  Fragment sum{};
  // The parity's offset (0 for an aborted entry: nothing is touched then).
  const long off = ok ? static_cast<long>(entry) * slots.parity_bytes : 0;
  auto own_slot = [&](int s) { return slots.own_slot(off, s); };
  if (active && ok && c.x) {
    if (c.system_fence) dev::fence_acq_rel_sys();
    // one_shot_push, over the precomputed addresses.
    push_to_all<kRanks>(mem, [&](int peer) { return slots.peer_slot(c.box, off, peer); }, mine);
  }
  // Why after the pushes: the epilogue's inputs are first needed after the polls,
  // and a load issued before the pushes shares the pushed fragment's scoreboard
  // (the pushes would wait for it too; old kernel's order).
  epi.load_inputs(row, at, active);
  if (active && ok) {
    const Call call{c.op, static_cast<int>(entry)};
    // one_shot_poll_sum, over the precomputed addresses.
    Fragment raw[kRanks];
    ok = poll_ranks<kRanks>(mem, c.team, call, own_slot, raw, row, frag * 8);
    if (ok) sum = c.clean_sum ? clean(sum_rank_order<kRanks>(raw)) : sum_rank_order<kRanks>(raw);
  }
  const bool rearm = active && ok;
  // Why late with several ranks on one GPU: a dependent grid launched early could
  // hold SM slots that a peer's grid of this call still needs (all_reduce.cu).
  if (!c.trigger_early) dev::pdl_launch_dependents();
  // The ticket right after the row sum's CTA barrier (see the entry above); its
  // result is first read by advance_if_last, after the epilogue.
  const auto take = [&] {
    if (threadIdx.x == 0 && entry != kAbortedEntry) ticket = take_ticket(mem, c.team, c.box);
  };
  epi.finish(sum, ok, row, at, frag, active, take);
  // Why after the epilogue: a cluster barrier's fence in it (the AttnRes row sums)
  // would wait for the thread's outstanding global stores; the re-arm only has to
  // precede the call's end.
  if (rearm) lamport::rearm<kRanks>(mem, own_slot);  // one_shot_rearm
  // Why: keeps the ticket's first use here; ptxas otherwise computes ticket + 1 at
  // once after the atomic (in the hook's branch), stalling thread 0 before its
  // cluster-sum stores for the atomic's round trip.
  asm volatile("" : "+r"(ticket));
  if (threadIdx.x == 0 && entry != kAbortedEntry)
    advance_if_last(mem, c.team, c.box, epoch, ticket, gridDim.x * gridDim.y);
  if (c.early) dev::pdl_wait();
}

}  // namespace tpdecode
