// Argument checks shared by the mailbox collectives.
#pragma once

#include <fmt/format.h>


#include "tpdecode/error.hpp"
#include "tpdecode/mailbox.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode {

// The rank is usable (no timeout pending) and the mailbox matches the team.
inline void require_comm_ready(const RankContext& ctx, const Mailbox::View& box, const char* op) {
  if (MailboxError e; read_error(ctx.error_host, &e)) {
    throw TimeoutError(fmt::format("{}: an earlier collective timed out ({}); call reset() first", op, describe(e)));
  }
  require(ctx.rank >= 0 && ctx.rank < ctx.size, fmt::format("{}: rank {} outside team of {}", op, ctx.rank, ctx.size));
  for (int r = 0; r < ctx.size; ++r)
    require(box.peers.base[r] != nullptr, fmt::format("{}: mailbox has no address for rank {}", op, r));
}

}  // namespace tpdecode
