// The team all-reduce of a program's norm op (GemmProgram::Norm::all_reduce in a
// TeamProgram), over the Lamport mailbox protocol (comm/protocol.hpp), written
// once for the kernel (program_norm.cuh) and the CPU model that runs it under host
// threads (tests/cpu/program_team_test.cpp).
//
// The team mailbox: [2 parities, ranks slots, m rows, row] in every rank's memory,
// each all-reduce op of the program a column window of the row (its 16-byte
// fragments from OpDesc::team_fragment). Each CTA's share of a norm op is the same
// columns on every rank (the ranks' programs have one plan), so CTA c of rank r
// pushes its pieces of r's partial into slot r of every rank's copy, then polls its
// own copy's slots for the same pieces, sums them in rank order (FP32 from rank 0's
// value, one BF16 rounding: the one-shot all-reduce's bits) and re-arms them.
//
// Epochs: one per run, from the mailbox's counter in the rank's control block:
// every finisher thread reads it (run_parity) before its first push of the run, and
// each CTA's finisher thread 0 takes its ticket after the CTA's last share
// (end_run); the last CTA of the run advances the counter. Every op of a run uses
// its own window, so one parity serves all of them. Reuse is the protocol's
// argument with a run as a use: rank p pushes run u + 2 into r's parity only after
// its run u + 1 read r's pushes of run u + 1, which r made after run u ended (a
// kernel boundary), and run u's re-arms are r's own stores before that boundary.
//
// Failure: every poll bounded by the team's deadline; a timeout is recorded (the
// rank, the missing slot, the token and column) and aborts the team; a run that
// finds the team aborted pushes nothing and uses NaN for the op's x. Either way the
// run completes (every CTA finishes every op, with NaN downstream), so no wait of
// the program itself is left hanging.
#pragma once

#include <cstdint>

#include "comm/protocol.hpp"

namespace tpdecode::program::team {

using lamport::Fragment;

// Where a piece (8 columns of one token) of an all-reduce op lives in a rank's copy.
TPD_HD Fragment* piece_slot(const lamport::MailboxRef& box, int owner, int parity, int source, int token,
                            int64_t fragment) {
  return lamport::slot_fragment(box, owner, parity, source, token, static_cast<int>(fragment));
}

// The parity of this run, or lamport::kAbortedEntry (the team has aborted: push
// nothing, use NaN). Any thread may call it any number of times within a run.
template <class Memory>
TPD_HD uint32_t run_parity(Memory& mem, const lamport::TeamRef& team, const lamport::MailboxRef& box) {
  uint32_t epoch = 0;
  return lamport::begin(mem, team, box, lamport::Op::kProgram, &epoch);
}

// This rank's piece into slot `team.rank` of every rank's copy.
template <int kRanks, class Memory>
TPD_HD void push_piece(Memory& mem, const lamport::TeamRef& team, const lamport::MailboxRef& box, uint32_t parity,
                       int token, int64_t fragment, const Fragment& mine) {
  lamport::push_to_all<kRanks>(
      mem, [&](int peer) { return piece_slot(box, peer, static_cast<int>(parity), team.rank, token, fragment); },
      mine);
}

// Every rank's piece from this rank's copy, summed in rank order, the slots
// re-armed; NaN where the team aborted or a rank never published (recorded).
template <int kRanks, class Memory>
TPD_HD Fragment reduce_piece(Memory& mem, const lamport::TeamRef& team, const lamport::MailboxRef& box,
                             uint32_t parity, int token, int64_t fragment) {
  auto own = [&](int source) {
    return piece_slot(box, team.rank, static_cast<int>(parity), source, token, fragment);
  };
  Fragment raw[kRanks];
  uint32_t missing = 0;
  const lamport::Poll result = lamport::wait_all<kRanks>(mem, own, raw, team.own, &missing);
  if (result != lamport::Poll::kDone) {
    lamport::report_poll(mem, team, {lamport::Op::kProgram, static_cast<int>(parity)}, result, missing, token,
                         static_cast<int>(fragment * 8));
    return lamport::poisoned();
  }
  lamport::rearm<kRanks>(mem, own);
  return lamport::sum_rank_order<kRanks>(raw);
}

// The CTA's arrival at the end of a run (once, by one thread, after every thread's
// last run_parity of the run and a CTA barrier): the last of `ctas` advances the
// epoch.
template <class Memory>
TPD_HD void end_run(Memory& mem, const lamport::TeamRef& team, const lamport::MailboxRef& box, unsigned ctas) {
  uint32_t epoch = 0;
  lamport::begin(mem, team, box, lamport::Op::kProgram, &epoch, /*report=*/false);
  lamport::advance_if_last(mem, team, box, epoch, lamport::take_ticket(mem, team, box), ctas);
}

}  // namespace tpdecode::program::team
