// A Lamport mailbox: a symmetric buffer of 32-bit words armed with the sentinel,
// laid out [parities, slots, rows_cap, row_bytes]. Slot s of a rank's copy is
// written only by rank s (a push) and re-armed only by its owner (the reader).
// The protocol and its reuse-safety argument: src/comm/lamport_protocol.hpp.
#pragma once

#include <cstdint>

#include "tpdecode/team.hpp"

namespace tpdecode {

inline constexpr uint32_t kMailboxSentinel = 0x80000000u;  // BF16 pair (+0, -0)

struct MailboxShape {
  int parities = 2;
  int slots = 1;        // usually the team size (one slot per writer)
  int rows_cap = 1;
  int64_t row_bytes = 0;  // a multiple of 16
};

class Mailbox {
 public:
  // Collective over the team; before any graph capture.
  Mailbox(Team& team, const MailboxShape& shape);

  // One parity of every rank's copy, as driven rank i's kernels see it.
  struct View {
    PeerPointers peers;  // [slots, rows_cap, row_bytes] of each rank, at this parity
    int slots = 0;
    int rows_cap = 0;
    int64_t row_bytes = 0;
    int parity = 0;
  };
  View view(int driven, int parity) const;
  const MailboxShape& shape() const { return shape_; }

 private:
  MailboxShape shape_;
  int team_size_;
  SymmetricBuffer buffer_;
};

}  // namespace tpdecode
