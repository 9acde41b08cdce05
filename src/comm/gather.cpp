#include "tpdecode/gather.hpp"

#include <algorithm>

#include "comm/comm_checks.hpp"
#include "comm/gather_launch.hpp"
#include "team/fill.hpp"

namespace tpdecode {

MailboxShape gather_mailbox_shape(int team_size, int rows_cap, int64_t shard_bytes) {
  return MailboxShape{2, 1, rows_cap, shard_bytes * team_size};
}

int gather_ctas(int rows, int64_t frags_per_row, int ranks_on_device) {
  const int64_t want = (frags_per_row + kGatherThreads - 1) / kGatherThreads;
  const int64_t budget = 192 / std::max<int64_t>(1, static_cast<int64_t>(rows) * std::max(1, ranks_on_device));
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({want, 32, budget})));
}

void gather(const RankContext& ctx, const Mailbox::View& box, const TensorView& shard, const TensorView& out,
            GatherMode mode) {
  require_comm_ready(ctx, box, "gather");
  require(shard.data && shard.rows >= 1 && shard.contiguous() && shard.aligned(16),
          fmt::format("gather: shard must be non-null, contiguous and 16-byte aligned ({})", shard.describe()));
  const int64_t shard_bytes = shard.cols * static_cast<int64_t>(shard.element_size());
  require(shard_bytes % 16 == 0, fmt::format("gather: shard rows of {} bytes, must be a multiple of 16", shard_bytes));
  require(box.slots == 1, fmt::format("gather: mailbox has {} slots, must be 1", box.slots));
  require(shard_bytes * ctx.size <= box.row_bytes,
          fmt::format("gather: {} ranks x {} bytes exceed the mailbox rows ({} bytes)", ctx.size, shard_bytes,
                      box.row_bytes));
  if (mode == GatherMode::kCopy) {
    require_rows(out, shard.dtype, shard.cols * ctx.size, "gather output");
    require(out.rows == shard.rows, fmt::format("gather: output has {} rows, shard {}", out.rows, shard.rows));
  }
  if (shard.rows > box.rows_cap)
    throw CapacityError(fmt::format("gather: {} rows exceed the mailbox capacity of {}", shard.rows, box.rows_cap));

  GatherParams p;
  p.box = box.peers;
  p.shard = shard.data;
  p.out = mode == GatherMode::kCopy ? out.data : nullptr;
  p.rank = ctx.rank;
  p.parity = box.parity;
  p.rows_cap = box.rows_cap;
  p.row_bytes = static_cast<long>(box.row_bytes);
  p.shard_frags = static_cast<int>(shard_bytes / 16);
  p.copy = mode == GatherMode::kCopy;
  p.trigger_early = ctx.ranks_on_device == 1;
  p.timeout_ns = ctx.timeout_ns;
  p.error = ctx.error_device;
  launch_gather(ctx, p, static_cast<int>(shard.rows));
}

const void* gathered_rows(const RankContext& ctx, const Mailbox::View& box) { return box.peers.base[ctx.rank]; }

void gather_rearm(const RankContext& ctx, const Mailbox::View& box, int rows) {
  require(rows >= 0 && rows <= box.rows_cap,
          fmt::format("gather_rearm: {} rows outside the mailbox capacity of {}", rows, box.rows_cap));
  fill_words(box.peers.base[ctx.rank], static_cast<std::size_t>(rows) * box.row_bytes / 4, kMailboxSentinel,
             ctx.stream);
}

}  // namespace tpdecode
