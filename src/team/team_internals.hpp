// What tpdecode's own objects (TpComm, the stock path, the mailboxes, PreparedOproj)
// need from a Team and an engine never calls: the driven ranks' launch contexts,
// symmetric allocations and mailbox epoch counters. Why here and not in team.hpp:
// the installed header is the API; these reach Team's internals as its friend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "team/rank_context.hpp"
#include "team/symmetric_buffer.hpp"
#include "tpdecode/comm.hpp"
#include "tpdecode/team.hpp"

namespace tpdecode {

namespace detail {
struct TeamInternals {
  static const RankContext& rank_context(const Team& team, int driven);
  static SymmetricBuffer allocate(Team& team, std::size_t bytes, uint32_t fill_word, std::string_view what);
  static int take_epoch_counter(Team& team);
  static TpComm& shared_comm(Team& team, const CommConfig& config, int group);
};
}  // namespace detail

// Driven rank `driven`'s launch context (InvalidArgument outside [0, driven())).
inline const RankContext& rank_context(const Team& team, int driven) {
  return detail::TeamInternals::rank_context(team, driven);
}

// Collective: a buffer of `bytes` (rounded up to 16) on every rank, every 32-bit
// word set to `fill_word`. Same order on every rank; never during capture. Kept
// until the team goes and refilled by reset(). `what` names its layout (a mailbox's
// owner, shape and epoch counter): the ranks compare it, the size and
// the fill first, and every rank raises InvalidArgument where one differs (a rank
// that built other objects). Throws Unavailable where the ranks do not share memory.
inline SymmetricBuffer allocate_symmetric_buffer(Team& team, std::size_t bytes, uint32_t fill_word,
                                                 std::string_view what) {
  return detail::TeamInternals::allocate(team, bytes, fill_word, what);
}

// An epoch counter in the control block, for one mailbox (same order on every rank).
inline int take_epoch_counter(Team& team) { return detail::TeamInternals::take_epoch_counter(team); }

// A TpComm of `config` the team keeps for the library's objects to share (the MLP
// blocks of a model's layers): the one made for an equal config and `group` before,
// else a new one (collective: every rank asks for the same configs in the same
// order; host only, before any capture; TeamBroken on a broken team). Why: each
// TpComm takes 3 of the team's 255 mailbox epoch counters and its memory for as long
// as the team lives. Its users' calls must be ordered on each rank; objects whose
// calls may run at once take other groups.
inline TpComm& shared_comm(Team& team, const CommConfig& config, int group = 0) {
  return detail::TeamInternals::shared_comm(team, config, group);
}

}  // namespace tpdecode
