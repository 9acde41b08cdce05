#include "tpdecode/mailbox.hpp"

#include <fmt/format.h>

#include "tpdecode/error.hpp"

namespace tpdecode {

Mailbox::Mailbox(Team& team, const MailboxShape& shape) : shape_(shape), team_size_(team.size()) {
  require(shape.parities >= 1 && shape.slots >= 1 && shape.rows_cap >= 1,
          fmt::format("mailbox shape [{}, {}, {}, ...] must be positive", shape.parities, shape.slots, shape.rows_cap));
  require(shape.row_bytes > 0 && shape.row_bytes % 16 == 0,
          fmt::format("mailbox rows of {} bytes: must be a positive multiple of 16", shape.row_bytes));
  const auto bytes = static_cast<std::size_t>(shape.parities) * shape.slots * shape.rows_cap * shape.row_bytes;
  buffer_ = team.allocate(bytes, kMailboxSentinel);
}

Mailbox::View Mailbox::view(int driven, int parity) const {
  require(parity >= 0 && parity < shape_.parities,
          fmt::format("mailbox parity {} outside [0, {})", parity, shape_.parities));
  View v;
  const PeerPointers& all = buffer_.peers(driven);
  const int64_t parity_bytes = static_cast<int64_t>(shape_.slots) * shape_.rows_cap * shape_.row_bytes;
  for (int r = 0; r < team_size_; ++r) v.peers.base[r] = static_cast<char*>(all.base[r]) + parity * parity_bytes;
  v.slots = shape_.slots;
  v.rows_cap = shape_.rows_cap;
  v.row_bytes = shape_.row_bytes;
  v.parity = parity;
  return v;
}

}  // namespace tpdecode
