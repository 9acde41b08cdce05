#include "tpdecode/all_reduce.hpp"

#include "comm/all_reduce_launch.hpp"
#include "comm/comm_checks.hpp"

namespace tpdecode {

MailboxShape all_reduce_mailbox_shape(int team_size, int rows_cap, int64_t hidden) {
  return MailboxShape{2, team_size, rows_cap, hidden * 2};
}

int all_reduce_max_rows(const RankContext& ctx, int64_t hidden) {
  const int per_row = all_reduce_ctas_per_row(static_cast<int>(hidden / 8));
  return all_reduce_ctas_per_rank(ctx) / per_row;
}

void all_reduce(const RankContext& ctx, const Mailbox::View& box, const TensorView& x, const TensorView& out) {
  require_comm_ready(ctx, box, "all_reduce");
  require(x.cols % 8 == 0, fmt::format("all_reduce: {} columns, must be a multiple of 8", x.cols));
  require_rows(x, DType::kBF16, x.cols, "all_reduce input");
  require_rows(out, DType::kBF16, x.cols, "all_reduce output");
  require(out.rows == x.rows, fmt::format("all_reduce: output has {} rows, input {}", out.rows, x.rows));
  require(box.slots == ctx.size, fmt::format("all_reduce: mailbox has {} slots for a team of {}", box.slots, ctx.size));
  require(x.rows <= box.rows_cap,
          fmt::format("all_reduce: {} rows exceed the mailbox capacity of {}", x.rows, box.rows_cap));
  require(x.cols * 2 <= box.row_bytes,
          fmt::format("all_reduce: rows of {} columns exceed the mailbox rows ({} bytes)", x.cols, box.row_bytes));

  AllReduceParams p;
  p.box = box.peers;
  p.x = x.data;
  p.out = out.data;
  p.rank = ctx.rank;
  p.parity = box.parity;
  p.rows_cap = box.rows_cap;
  p.frags = static_cast<int>(x.cols / 8);
  p.row_bytes = static_cast<long>(box.row_bytes);
  p.timeout_ns = ctx.timeout_ns;
  p.error = ctx.error_device;
  p.trigger_early = ctx.ranks_on_device == 1;
  launch_all_reduce(ctx, p, static_cast<int>(x.rows));
}

}  // namespace tpdecode
