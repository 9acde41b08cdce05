// A Lamport mailbox: a symmetric buffer laid out [parities, slots, rows_cap,
// row_bytes], armed with the sentinel, and an epoch counter in the team's control
// block that picks the parity of each use (protocol.hpp). Slot s of a rank's copy
// is written only by rank s and re-armed only by its owner.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "comm/protocol.hpp"
#include "tpdecode/team.hpp"

namespace tpdecode {

class Mailbox {
 public:
  // Collective over the team; before any capture. `owner` names the object and use
  // (the ranks compare it with the shape: team/symmetric_layout.hpp).
  Mailbox(Team& team, std::string_view owner, int parities, int slots, int rows_cap, int64_t row_bytes);
  // The same, sharing `epoch_of`'s epoch counter: for two mailboxes that every call
  // uses with one parity (the two-shot's recv and gather halves). Each CTA of such a
  // call enters once, through either.
  Mailbox(Team& team, std::string_view owner, int parities, int slots, int rows_cap, int64_t row_bytes,
          const Mailbox& epoch_of);
  // The mailbox as driven rank i's calls see it.
  const lamport::MailboxRef& ref(int i) const { return refs_.at(static_cast<std::size_t>(i)); }
  int rows_cap() const { return rows_cap_; }
  int64_t row_bytes() const { return row_bytes_; }

 private:
  Mailbox(Team& team, std::string_view owner, int parities, int slots, int rows_cap, int64_t row_bytes,
          int epoch_index);

  int rows_cap_;
  int64_t row_bytes_;
  std::vector<lamport::MailboxRef> refs_;
};

}  // namespace tpdecode
