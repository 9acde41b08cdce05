// The row body's precomputed slot addresses (row_slots.hpp) are slot_fragment's,
// for any team, rank, parity, slot, row and fragment of a one-shot mailbox built
// as the real one (HostTeam::box_ref: [parities, TP, rows_cap, row_bytes]).
#include <gtest/gtest.h>

#include <random>

#include "comm/row_slots.hpp"
#include "cpu/protocol_harness.hpp"

namespace tpdecode::test {
namespace {

TEST(RowSlots, AreSlotFragmentsAddresses) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 1000; ++trial) {
    const int ranks = 2 + static_cast<int>(rng() % 7);
    const int rank = static_cast<int>(rng() % static_cast<unsigned>(ranks));
    const int parities = 2 + static_cast<int>(rng() % 2);
    const int parity = static_cast<int>(rng() % static_cast<unsigned>(parities));
    const int rows_cap = 1 + static_cast<int>(rng() % 12);
    const int row = static_cast<int>(rng() % static_cast<unsigned>(rows_cap));
    const int frags = 1 + static_cast<int>(rng() % 48);  // row_bytes / 16
    const int frag = static_cast<int>(rng() % static_cast<unsigned>(frags));
    HostTeam team(ranks, std::chrono::seconds(1));
    const lamport::MailboxRef box = team.box_ref(team.add_mailbox(parities, ranks, rows_cap, frags));
    const RowSlots slots(team.team_ref(rank), box, row, frag);
    const long off = parity * box.parity_bytes;
    for (int s = 0; s < ranks; ++s) {
      ASSERT_EQ(slots.own_slot(off, s), lamport::slot_fragment(box, rank, parity, s, row, frag))
          << "own slot " << s << " of rank " << rank << "/" << ranks << ", parity " << parity << "/" << parities
          << ", row " << row << "/" << rows_cap << ", fragment " << frag << "/" << frags;
      ASSERT_EQ(slots.peer_slot(box, off, s), lamport::slot_fragment(box, s, parity, rank, row, frag))
          << "rank " << rank << "/" << ranks << "'s slot in peer " << s << ", parity " << parity << "/" << parities
          << ", row " << row << "/" << rows_cap << ", fragment " << frag << "/" << frags;
    }
  }
}

}  // namespace
}  // namespace tpdecode::test
