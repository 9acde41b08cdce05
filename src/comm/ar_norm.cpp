#include "tpdecode/ar_norm.hpp"

#include "comm/ar_norm_launch.hpp"
#include "comm/comm_checks.hpp"

namespace tpdecode {

int ar_norm_max_resident_rows(const RankContext& ctx, int64_t hidden) {
  require(ar_norm_hidden_supported(hidden), fmt::format("ar_norm: hidden size {} is not supported", hidden));
  return ar_norm_resident_rows(ctx, static_cast<int>(hidden));
}

void ar_norm(const RankContext& ctx, const Mailbox::View& box, const ArNormIo& io) {
  require_comm_ready(ctx, box, "ar_norm");
  const int64_t hidden = io.x.cols;
  require(ar_norm_hidden_supported(hidden),
          fmt::format("ar_norm: hidden size {} is not supported (4096, 5120, 7168 or 8192)", hidden));
  require_rows(io.x, DType::kBF16, hidden, "ar_norm input");
  if (io.residual.data) {
    require_rows(io.residual, DType::kBF16, hidden, "ar_norm residual");
    require(io.residual.rows == io.x.rows, fmt::format("ar_norm: residual has {} rows, input {}", io.residual.rows, io.x.rows));
  }
  require_rows(io.weight, DType::kBF16, hidden, "ar_norm weight");
  require(io.weight.rows == 1, fmt::format("ar_norm: weight has {} rows, must be 1", io.weight.rows));
  require_rows(io.out, DType::kBF16, hidden, "ar_norm output");
  require_rows(io.residual_out, DType::kBF16, hidden, "ar_norm residual output");
  require(io.out.rows == io.x.rows && io.residual_out.rows == io.x.rows,
          fmt::format("ar_norm: outputs have {} and {} rows, input {}", io.out.rows, io.residual_out.rows, io.x.rows));
  require(box.slots == ctx.size, fmt::format("ar_norm: mailbox has {} slots for a team of {}", box.slots, ctx.size));
  require(hidden * 2 <= box.row_bytes,
          fmt::format("ar_norm: rows of {} columns exceed the mailbox rows ({} bytes)", hidden, box.row_bytes));
  if (io.x.rows > box.rows_cap)
    throw CapacityError(fmt::format("ar_norm: {} rows exceed the mailbox capacity of {}", io.x.rows, box.rows_cap));

  ArNormParams p;
  p.box = box.peers;
  p.x = io.x.data;
  p.residual = io.residual.data;
  p.weight = io.weight.data;
  p.out = io.out.data;
  p.residual_out = io.residual_out.data;
  p.eps = io.eps;
  p.hidden = static_cast<int>(hidden);
  p.rank = ctx.rank;
  p.parity = box.parity;
  p.rows_cap = box.rows_cap;
  p.row_bytes = static_cast<long>(box.row_bytes);
  p.trigger_early = ctx.ranks_on_device == 1;
  p.timeout_ns = ctx.timeout_ns;
  p.error = ctx.error_device;
  launch_ar_norm(ctx, p, static_cast<int>(io.x.rows));
}

}  // namespace tpdecode
