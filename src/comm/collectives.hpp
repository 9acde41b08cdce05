// The per-fragment bodies of the mailbox collectives, over the protocol
// (protocol.hpp). A kernel thread runs them for its fragments; the CPU protocol
// tests run the same functions from host threads (one "thread" per rank). Every
// thread makes all its pushes before its first poll, and the launchers guarantee
// that every rank's grid is co-resident, so a poll only waits on pushes that are
// made by running or finished threads.
#pragma once

#include "comm/protocol.hpp"

namespace tpdecode::lamport {

// ---- One-shot all-reduce: every rank pushes its partial into slot [rank] of
// every rank's mailbox [parity, TP, rows_cap, row]; every rank sums its TP slots.

template <int kRanks, class Memory>
TPD_HD void one_shot_push(Memory& mem, const TeamRef& team, const MailboxRef& box, const Call& call, int row, int frag,
                          const Fragment& mine) {
  push_to_all<kRanks>(
      mem, [&](int peer) { return slot_fragment(box, peer, call.parity, team.rank, row, frag); }, mine);
}

// Polls the TP slots of (row, frag), sums them in rank order into *sum and
// re-arms them. False on a timeout or an abort (recorded).
template <int kRanks, class Memory>
TPD_HD bool one_shot_collect(Memory& mem, const TeamRef& team, const MailboxRef& box, const Call& call, int row,
                             int frag, Fragment* sum) {
  auto slot_of = [&](int s) { return slot_fragment(box, team.rank, call.parity, s, row, frag); };
  Fragment raw[kRanks];
  uint32_t missing = 0;
  const Poll result = wait_all<kRanks>(mem, slot_of, raw, team.control[team.rank], &missing);
  if (result != Poll::kDone) {
    report_poll(mem, team, call, result, missing, row, frag * 8);
    return false;
  }
  rearm<kRanks>(mem, slot_of);
  *sum = sum_rank_order<kRanks>(raw);
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

// Polls fragment `frag` of the gathered row, copies it to *out and re-arms it.
template <class Memory>
TPD_HD bool gather_collect(Memory& mem, const TeamRef& team, const MailboxRef& box, const Call& call, int row,
                           int frag, int shard_frags, Fragment* out) {
  Fragment* slot = slot_fragment(box, team.rank, call.parity, 0, row, frag);
  Fragment raw[1];
  uint32_t missing = 0;
  const Poll result = wait_all<1>(mem, [&](int) { return slot; }, raw, team.control[team.rank], &missing);
  if (result != Poll::kDone) {
    // Why the writer's rank as the slot: the gathered row has one slot, and the
    // fragment's writer is the peer that did not arrive.
    report_poll(mem, team, call, result, result == Poll::kTimedOut ? static_cast<uint32_t>(frag / shard_frags) : missing,
                row, frag * 16);
    return false;
  }
  mem.push(slot, armed());
  *out = raw[0];
  return true;
}

}  // namespace tpdecode::lamport
