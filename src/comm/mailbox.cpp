#include "comm/mailbox.hpp"

#include "core/check.hpp"
#include "team/team_internals.hpp"

namespace tpdecode {

Mailbox::Mailbox(Team& team, std::string_view owner, int parities, int slots, int rows_cap, int64_t row_bytes)
    : Mailbox(team, owner, parities, slots, rows_cap, row_bytes, take_epoch_counter(team)) {}

Mailbox::Mailbox(Team& team, std::string_view owner, int parities, int slots, int rows_cap, int64_t row_bytes,
                 const Mailbox& epoch_of)
    : Mailbox(team, owner, parities, slots, rows_cap, row_bytes, epoch_of.refs_.at(0).index) {
  // Why: both are used with epoch % parities; they must agree on it.
  check(parities == epoch_of.refs_.at(0).parities, "mailbox: {} parities sharing the epoch of a mailbox of {}",
        parities, epoch_of.refs_.at(0).parities);
}

Mailbox::Mailbox(Team& team, std::string_view owner, int parities, int slots, int rows_cap, int64_t row_bytes,
                 int epoch_index)
    : rows_cap_(rows_cap), row_bytes_(row_bytes) {
  check(parities >= 2 && parities <= 3, "mailbox: {} parities (2 or 3)", parities);
  check(slots >= 1 && rows_cap >= 1, "mailbox shape [{}, {}, {}, ...] must be positive", parities, slots, rows_cap);
  check(row_bytes > 0 && row_bytes % 16 == 0, "mailbox rows of {} bytes: must be a positive multiple of 16", row_bytes);
  const long parity_bytes = static_cast<long>(slots) * rows_cap * row_bytes;
  const SymmetricBuffer buffer = allocate_symmetric_buffer(
      team, static_cast<std::size_t>(parity_bytes) * parities, lamport::kSentinel,
      fmt::format("{} mailbox {}x{}x{}x{} B, epoch {}", owner, parities, slots, rows_cap, row_bytes, epoch_index));
  for (int i = 0; i < team.driven(); ++i) {
    lamport::MailboxRef r{};
    for (int peer = 0; peer < team.size(); ++peer) r.base[peer] = static_cast<char*>(buffer.peers(i).base[peer]);
    r.parity_bytes = parity_bytes;
    r.row_bytes = static_cast<long>(row_bytes);
    r.rows_cap = rows_cap;
    r.parities = parities;
    r.index = epoch_index;
    refs_.push_back(r);
  }
}

}  // namespace tpdecode
