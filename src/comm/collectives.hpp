// The per-fragment bodies of the mailbox collectives, over the protocol
// (protocol.hpp). A kernel thread runs them for its fragments; the CPU protocol
// tests run the same functions from host threads (one "thread" per rank). Every
// thread makes all its pushes before its first poll, and the launchers guarantee
// that every rank's grid is co-resident, so a poll only waits on pushes that are
// made by running or finished threads.
#pragma once

#include "comm/protocol.hpp"

namespace tpdecode::lamport {

// Polls the kRanks slots slot_of(s) of the caller's own memory into raw. False on
// a timeout or an abort, reported at (row, column): the one-shot's and the
// two-shot owner's wait.
template <int kRanks, class Memory, class SlotOf>
TPD_HD bool poll_ranks(Memory& mem, const TeamRef& team, const Call& call, SlotOf slot_of, Fragment (&raw)[kRanks],
                       int row, int column) {
  uint32_t missing = 0;
  const Poll result = wait_all<kRanks>(mem, slot_of, raw, team.own, &missing);
  if (result == Poll::kDone) return true;
  report_poll(mem, team, call, result, missing, row, column);
  return false;
}

// ---- One-shot all-reduce: every rank pushes its partial into slot [rank] of
// every rank's mailbox [parity, TP, rows_cap, row]; every rank sums its TP slots.

template <int kRanks, class Memory>
TPD_HD void one_shot_push(Memory& mem, const TeamRef& team, const MailboxRef& box, const Call& call, int row, int frag,
                          const Fragment& mine) {
  push_to_all<kRanks>(
      mem, [&](int peer) { return slot_fragment(box, peer, call.parity, team.rank, row, frag); }, mine);
}

// Polls the TP slots of (row, frag) and sums them in rank order into *sum; the
// caller re-arms them (one_shot_rearm) before its call ends. False on a timeout or
// an abort (recorded; nothing to re-arm).
template <int kRanks, class Memory>
TPD_HD bool one_shot_poll_sum(Memory& mem, const TeamRef& team, const MailboxRef& box, const Call& call, int row,
                              int frag, Fragment* sum) {
  auto slot_of = [&](int s) { return slot_fragment(box, team.rank, call.parity, s, row, frag); };
  Fragment raw[kRanks];
  if (!poll_ranks<kRanks>(mem, team, call, slot_of, raw, row, frag * 8)) return false;
  *sum = sum_rank_order<kRanks>(raw);
  return true;
}

template <int kRanks, class Memory>
TPD_HD void one_shot_rearm(Memory& mem, const TeamRef& team, const MailboxRef& box, const Call& call, int row,
                           int frag) {
  rearm<kRanks>(mem, [&](int s) { return slot_fragment(box, team.rank, call.parity, s, row, frag); });
}

// Both at once: polls, sums and re-arms. False on a timeout or an abort (recorded).
template <int kRanks, class Memory>
TPD_HD bool one_shot_collect(Memory& mem, const TeamRef& team, const MailboxRef& box, const Call& call, int row,
                             int frag, Fragment* sum) {
  if (!one_shot_poll_sum<kRanks>(mem, team, box, call, row, frag, sum)) return false;
  one_shot_rearm<kRanks>(mem, team, box, call, row, frag);
  return true;
}

// ---- Gather: every rank's [rows, S] shard into the [rows, TP·S] row of every
// rank: one slot [parity, 1, rows_cap, TP·S]; rank r's shard fragment f goes to
// fragment r·shard_frags + f of the row in every rank's copy.

template <int kRanks, class Memory>
TPD_HD void gather_push(Memory& mem, const TeamRef& team, const MailboxRef& box, const Call& call, int row,
                        int shard_frag, int shard_frags, const Fragment& mine) {
  const int column = team.rank * shard_frags + shard_frag;
  push_to_all<kRanks>(
      mem, [&](int peer) { return slot_fragment(box, peer, call.parity, 0, row, column); }, mine);
}

// Polls one fragment of the caller's own memory, written by rank `writer`, copies
// it to *out and re-arms it (the gather and the two-shot's gather half).
template <class Memory>
TPD_HD bool collect_one(Memory& mem, const TeamRef& team, Fragment* slot, const Call& call, int writer, int row,
                        int column, Fragment* out) {
  Fragment raw[1];
  uint32_t missing = 0;
  const Poll result = wait_all<1>(mem, [&](int) { return slot; }, raw, team.own, &missing);
  if (result != Poll::kDone) {
    // Why the writer's rank as the slot: the gathered row has one slot, and the
    // fragment's writer is the peer that did not arrive.
    report_poll(mem, team, call, result, result == Poll::kTimedOut ? static_cast<uint32_t>(writer) : missing, row,
                column);
    return false;
  }
  mem.push(slot, armed());
  *out = raw[0];
  return true;
}

// Polls fragment `frag` of the gathered row, copies it to *out and re-arms it.
template <class Memory>
TPD_HD bool gather_collect(Memory& mem, const TeamRef& team, const MailboxRef& box, const Call& call, int row,
                           int frag, int shard_frags, Fragment* out) {
  return collect_one(mem, team, slot_fragment(box, team.rank, call.parity, 0, row, frag), call, frag / shard_frags, row,
                     frag * 16, out);
}

// ---- Two-shot all-reduce (reduce-scatter to column owners, owners broadcast).
// Owner o owns the owner_frags fragments [o·owner_frags, (o+1)·owner_frags) of a
// row (W = width / TP columns). Two mailboxes, used once per call with one parity
// (one epoch counter): recv [parity, TP, rows_cap, W] in each owner's memory, slot
// s written only by rank s; gather [parity, 1, rows_cap, width] in each rank's
// memory, fragment f written only by its owner. A thread makes all its pushes, then
// its reductions, then its collects: a reduction waits only on pushes, a collect
// only on reductions.
//
// Reuse with two parities (every reader re-arms in the same call; uses u and u+2
// share a parity):
//  - recv slot [s] of owner o: s pushes use u+2 only after its call u+1 ended,
//    which needed o's sums of u+1 (every rank collects every owner's columns), which
//    o stored in its call u+1, after its call u, and with it o's re-arm of u,
//    completed. So o's re-arm of u precedes s's push of u+2.
//  - gather fragment of rank q, written by owner o: o stores the sum of u+2 only
//    after reading q's push of u+2, which q made after its call u (and its re-arm
//    of u) completed. (u+1 would be safe too: the gather half takes recv's parity.)
// The orderings are protocol.hpp's two kernel boundaries; within a call a sum is
// computed from the values polled, and no peer relies on the order of an owner's
// sums and its re-arm (a peer's next push into that parity waits for the owner's
// next call).
// Three parities serve a reader that re-arms lazily, during its next call (an
// MoE tail that re-arms the previous layer's rows): o's re-arm of u may then follow its sums of u+1, so u+2 is not
// safe; s pushes u+3 only after seeing o's sums of u+2, stored in o's call u+2,
// after its call u+1 (and the lazy re-arm) completed. The kernels here re-arm in
// the call; CommConfig::parities = 3 builds buffers for callers that do not.

// Push: this rank's fragment `frag` of `row` into slot [rank] of its owner's recv.
template <class Memory>
TPD_HD void two_shot_push(Memory& mem, const TeamRef& team, const MailboxRef& recv, const Call& call, int row, int frag,
                          int owner_frags, const Fragment& mine) {
  const int owner = frag / owner_frags;
  mem.push(slot_fragment(recv, owner, call.parity, team.rank, row, frag - owner * owner_frags), clean(mine));
}

// In kernels where a thread holds fragment `frag` of every row it serves (ArNorm's
// geometry): the owned chunk that thread reduces, or -1. The reducers are the
// threads holding this rank's own columns. Why: they form warps of their own (no
// warp waits on some lanes' reductions before its other lanes collect), and a
// reducer's collect is the sum it stored itself (reducers on every TP-th thread
// cost 0.7 µs at 1 row and 1.2 at 64, NCCL TP 2: docs/history/performance-2026-11.md,
// "The two-shot ArNorm's body at NCCL TP 2").
TPD_HD int two_shot_own_chunk(int rank, int frag, int owner_frags) {
  const int chunk = frag - rank * owner_frags;
  return chunk >= 0 && chunk < owner_frags ? chunk : -1;
}

// Reduce, run by the owner (this rank) of chunk `chunk` (< owner_frags) of `row`:
// polls the TP slots in its own recv, sums them in rank order (one rounding),
// stores the cleaned sum into every rank's gather row (TP peer stores), then
// re-arms its slots. False on a timeout or an abort (recorded; nothing stored).
template <int kRanks, class Memory>
TPD_HD bool two_shot_reduce(Memory& mem, const TeamRef& team, const MailboxRef& recv, const MailboxRef& gather,
                            const Call& call, int row, int chunk, int owner_frags) {
  auto slot_of = [&](int s) { return slot_fragment(recv, team.rank, call.parity, s, row, chunk); };
  const int frag = team.rank * owner_frags + chunk;  // in the gathered row
  Fragment raw[kRanks];
  if (!poll_ranks<kRanks>(mem, team, call, slot_of, raw, row, frag * 8)) return false;
  push_to_all<kRanks>(
      mem, [&](int peer) { return slot_fragment(gather, peer, call.parity, 0, row, frag); },
      sum_rank_order<kRanks>(raw));
  rearm<kRanks>(mem, slot_of);
  return true;
}

// Called by a thread between its reductions and its first collect: the gather half
// waits one team timeout longer. Why: a push that never came must be reported by
// the reductions that wait on it (naming the absent rank), not by a gather poll
// behind an owner that waits on it too; only an owner that never reduces is
// reported by the gather.
template <class Memory>
TPD_HD void two_shot_gather_phase(Memory& mem, const TeamRef& team) {
  mem.extend_deadline(team.timeout_ns);
}

// Collect: polls fragment `frag` of this rank's gather row, copies it to *out and
// re-arms it; a timeout names the fragment's owner.
template <class Memory>
TPD_HD bool two_shot_collect(Memory& mem, const TeamRef& team, const MailboxRef& gather, const Call& call, int row,
                             int frag, int owner_frags, Fragment* out) {
  return collect_one(mem, team, slot_fragment(gather, team.rank, call.parity, 0, row, frag), call, frag / owner_frags,
                     row, frag * 8, out);
}

}  // namespace tpdecode::lamport
