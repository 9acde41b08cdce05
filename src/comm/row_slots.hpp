// The row body's mailbox addresses (row_collective.cuh), apart from it so that the
// CPU tests check them against slot_fragment (tests/cpu/row_slots_test.cpp).
#pragma once

#include "comm/protocol.hpp"

namespace tpdecode {

// The row's mailbox addresses at parity 0, from the kernel's parameters alone
// (slot_fragment's arithmetic, split so that only the parity's offset is left to
// add once the entry has picked it). Why: computed before griddepcontrol.wait, its
// parameter reads (team.rank, box.base, box.row_bytes, box.rows_cap,
// box.parity_bytes) and its ~30 dependent integer instructions leave the path from
// the entry to the first push, from the push to the first poll, and from the
// epilogue's stores to the re-arm (which otherwise re-reads the entry from shared
// memory and redoes them at the kernel's end).
struct RowSlots {
  char* own;          // slot 0 of (row, frag) in this rank's copy; slot s at own + s * slot_bytes
  long push;          // offset of slot [rank] of (row, frag) in every rank's copy
  long slot_bytes;    // rows_cap * row_bytes
  long parity_bytes;  // box.parity_bytes

  TPD_HD RowSlots(const lamport::TeamRef& team, const lamport::MailboxRef& box, int row, int frag) {
    const long at = static_cast<long>(row) * box.row_bytes + static_cast<long>(frag) * sizeof(lamport::Fragment);
    slot_bytes = box.rows_cap * box.row_bytes;
    own = box.base[team.rank] + at;
    push = team.rank * slot_bytes + at;
    parity_bytes = box.parity_bytes;
#if defined(__CUDA_ARCH__)
    // Why: keeps the arithmetic (and its parameter reads) where it stands, before
    // the wait; nvcc would otherwise sink it to its first use after the wait.
    asm volatile("" : "+l"(own), "+l"(push), "+l"(slot_bytes), "+l"(parity_bytes));
#endif
  }
  // slot_fragment(box, team.rank, parity, s, row, frag), given off = parity * parity_bytes.
  TPD_HD lamport::Fragment* own_slot(long off, int s) const {
    return reinterpret_cast<lamport::Fragment*>(own + off + s * slot_bytes);
  }
  // slot_fragment(box, peer, parity, team.rank, row, frag).
  TPD_HD lamport::Fragment* peer_slot(const lamport::MailboxRef& box, long off, int peer) const {
    return reinterpret_cast<lamport::Fragment*>(box.base[peer] + off + push);
  }
};

}  // namespace tpdecode
