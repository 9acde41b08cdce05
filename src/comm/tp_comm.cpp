// TpComm: argument checks, the choice of path (rules.hpp) and the launches.
#include <algorithm>
#include <optional>
#include <tuple>
#include <vector>

#include "comm/kernels.hpp"
#include "comm/mailbox.hpp"
#include "comm/rules.hpp"
#include "comm/stock.hpp"
#include "core/check.hpp"
#include "team/rank_streams.hpp"
#include "team/team_internals.hpp"
#include "tpdecode/comm.hpp"

namespace tpdecode {

const char* comm_path_name(CommPath path) {
  switch (path) {
    case CommPath::kOneShot: return "one-shot";
    case CommPath::kTwoShot: return "two-shot";
    case CommPath::kStock: return "stock";
  }
  return "?";
}

const char* ar_norm_quant_name(ArNormQuant q) {
  switch (q) {
    case ArNormQuant::kNone: return "bf16";
    case ArNormQuant::kStatic: return "fp8-static";
    case ArNormQuant::kGroup: return "fp8-group";
    case ArNormQuant::kGroupUe8m0: return "fp8-group-ue8m0";
  }
  return "?";
}

namespace {

// Every driven rank's call has the same shape as driven rank 0's.
template <class Io, class Shape>
void check_same_shapes(std::span<const Io> io, Shape shape, const char* op) {
  for (std::size_t i = 1; i < io.size(); ++i)
    check(shape(io[i]) == shape(io[0]), "{}: driven rank {} has another shape than driven rank 0", op, i);
}

}  // namespace

class TpComm::Impl {
 public:
  Impl(Team& team, const CommConfig& config) : team_(team), system_fence_(config.system_fence) {
    check(config.rows_cap >= 1, "comm: rows_cap {} (at least 1)", config.rows_cap);
    check(config.hidden >= 8 && config.hidden % 8 == 0, "comm: hidden {} (a positive multiple of 8)", config.hidden);
    check(config.parities == 2 || config.parities == 3, "comm: {} parities (2 or 3)", config.parities);
    clean_sum_ = config.batch_invariant;
    limits_.batch_invariant = config.batch_invariant;
    const int64_t gather_bytes = config.gather_row_bytes ? config.gather_row_bytes : config.hidden * 2;
    check(gather_bytes % 16 == 0, "comm: gather rows of {} bytes (a multiple of 16)", gather_bytes);
    limits_.team_size = team.size();
    limits_.shares_memory = team.shares_memory();
    limits_.hidden = config.hidden;
    limits_.rows_cap = config.rows_cap;
    limits_.gather_row_bytes = gather_bytes;
    if (team.size() > 1 && team.shares_memory()) {
      const RankContext& ctx = rank_context(team, 0);
      one_shot_.emplace(team, "TpComm one-shot", config.parities, team.size(), config.rows_cap, config.hidden * 2);
      gather_box_.emplace(team, "TpComm gather", config.parities, 1, config.rows_cap, gather_bytes);
      limits_.one_shot_rows = std::min(config.rows_cap, one_shot_resident_rows(ctx, config.hidden));
      limits_.ar_norm_rows =
          ar_norm_hidden_served(config.hidden) ? std::min(config.rows_cap, ar_norm_resident_rows(ctx, config.hidden)) : 0;
      limits_.gather_rows = std::min(config.rows_cap, gather_resident_rows(ctx));
      build_two_shot(team, config);
    }
    const int64_t stock_row_bytes = std::max(config.hidden * 2, gather_bytes / team.size());
    stock_.emplace(team, config.rows_cap, (stock_row_bytes + 15) / 16 * 16, config.batch_invariant);
  }

  const CommLimits& limits() const { return limits_; }

  void begin(std::size_t ios, std::span<const cudaStream_t> streams, const char* op) const {
    check(static_cast<int>(ios) == team_.driven() && static_cast<int>(streams.size()) == team_.driven(),
          "{}: {} argument sets and {} streams for {} driven ranks", op, ios, streams.size(), team_.driven());
    check_distinct_streams(streams, op);
    team_.check_errors();
  }

  void one_shot(std::span<const AllReduceIo> io, std::span<const cudaStream_t> streams) {
    for (int i = 0; i < team_.driven(); ++i) {
      const RankContext& ctx = rank_context(team_, i);
      OneShotParams p{};
      p.team = ctx.team;
      p.box = one_shot_->ref(i);
      p.x = io[i].x.data;
      p.out = io[i].out.data;
      p.frags = static_cast<int>(io[i].x.cols / 8);
      p.trigger_early = ctx.ranks_on_device == 1;
      p.system_fence = system_fence_;
      p.clean_sum = clean_sum_;
      launch_one_shot(ctx, streams[i], p, static_cast<int>(io[i].x.rows));
    }
  }

  void ar_norm(std::span<const ArNormIo> io, std::span<const cudaStream_t> streams) {
    for (int i = 0; i < team_.driven(); ++i) {
      const RankContext& ctx = rank_context(team_, i);
      const ArNormIo& a = io[i];
      ArNormParams p{};
      p.team = ctx.team;
      p.box = one_shot_->ref(i);
      p.x = a.x.data;
      p.norm = ar_norm_tail(a);
      p.hidden = static_cast<int>(a.x.cols);
      p.trigger_early = ctx.ranks_on_device == 1;
      p.system_fence = system_fence_;
      p.clean_sum = clean_sum_;
      launch_ar_norm(ctx, streams[i], p, static_cast<int>(a.x.rows));
    }
  }

  void gather(std::span<const GatherIo> io, std::span<const cudaStream_t> streams) {
    for (int i = 0; i < team_.driven(); ++i) {
      const RankContext& ctx = rank_context(team_, i);
      GatherParams p{};
      p.team = ctx.team;
      p.box = gather_box_->ref(i);
      p.shard = io[i].shard.data;
      p.out = io[i].out.data;
      p.shard_frags = static_cast<int>(io[i].shard.cols * io[i].shard.element_size() / 16);
      p.trigger_early = ctx.ranks_on_device == 1;
      launch_gather(ctx, streams[i], p, static_cast<int>(io[i].shard.rows));
    }
  }

  void two_shot(std::span<const AllReduceIo> io, std::span<const cudaStream_t> streams) {
    for (int i = 0; i < team_.driven(); ++i) {
      const RankContext& ctx = rank_context(team_, i);
      launch_two_shot_all_reduce(ctx, streams[i], two_shot_params(i, io[i].x, io[i].out.data), two_shot_ctas_);
    }
  }

  void two_shot_ar_norm(std::span<const ArNormIo> io, std::span<const cudaStream_t> streams) {
    for (int i = 0; i < team_.driven(); ++i) {
      const RankContext& ctx = rank_context(team_, i);
      const ArNormIo& a = io[i];
      TwoShotNormParams p{};
      p.base = two_shot_params(i, a.x, nullptr);
      p.norm = ar_norm_tail(a);
      launch_two_shot_ar_norm(ctx, streams[i], p, two_shot_clusters_);
    }
  }

  StockPath& stock() { return *stock_; }

 private:
  // The two-shot's buffers, [parities, TP, rows_cap, W] (W = hidden / TP rounded up
  // to whole 16-byte chunks) and [parities, 1, rows_cap, hidden], with one epoch
  // counter (both halves of a call take its parity), and its grids' budgets.
  void build_two_shot(Team& team, const CommConfig& config) {
    const RankContext& ctx = rank_context(team, 0);
    const int64_t owned_bytes = (config.hidden + 8 * team.size() - 1) / (8 * team.size()) * 16;
    two_shot_recv_.emplace(team, "TpComm two-shot", config.parities, team.size(), config.rows_cap, owned_bytes);
    two_shot_gather_.emplace(team, "TpComm two-shot gather", config.parities, 1, config.rows_cap, config.hidden * 2,
                             *two_shot_recv_);
    two_shot_ctas_ = two_shot_all_reduce_budget(ctx);
    two_shot_clusters_ = ar_norm_hidden_served(config.hidden) ? two_shot_ar_norm_budget(ctx, config.hidden) : 0;
    limits_.two_shot_rows = two_shot_ctas_ > 0 ? config.rows_cap : 0;
    limits_.two_shot_norm_rows = two_shot_clusters_ > 0 ? config.rows_cap : 0;
    limits_.one_gpu = ctx.ranks_on_device > 1;
  }

  TwoShotParams two_shot_params(int i, const TensorView& x, void* out) const {
    const RankContext& ctx = rank_context(team_, i);
    TwoShotParams p{};
    p.team = ctx.team;
    p.recv = two_shot_recv_->ref(i);
    p.gather = two_shot_gather_->ref(i);
    p.x = x.data;
    p.out = out;
    p.width = static_cast<int>(x.cols);
    p.rows = static_cast<int>(x.rows);
    p.trigger_early = ctx.ranks_on_device == 1;
    return p;
  }

  Team& team_;
  bool system_fence_;
  bool clean_sum_ = false;  // CommConfig::batch_invariant
  CommLimits limits_;
  std::optional<Mailbox> one_shot_;   // [parities, TP, rows_cap, hidden] bf16: all_reduce and ar_norm
  std::optional<Mailbox> gather_box_;  // [parities, 1, rows_cap, gather_row_bytes]
  std::optional<Mailbox> two_shot_recv_;    // [parities, TP, rows_cap, hidden / TP] bf16
  std::optional<Mailbox> two_shot_gather_;  // [parities, 1, rows_cap, hidden] bf16, the recv's epoch
  int two_shot_ctas_ = 0;                   // the all-reduce's grid budget per rank
  int two_shot_clusters_ = 0;               // the ArNorm's, in clusters
  std::optional<StockPath> stock_;
};

TpComm::TpComm(Team& team, const CommConfig& config)
    : team_(team), config_(config), impl_(std::make_unique<Impl>(team, config)) {}

TpComm::~TpComm() = default;

CommResult TpComm::plan_all_reduce(const AllReduceIo& io) const {
  check_all_reduce(io);
  return tpdecode::plan_all_reduce(impl_->limits(), config_.algorithm, io.x.rows, io.x.cols, false).result;
}

CommResult TpComm::plan_ar_norm(const ArNormIo& io) const {
  check_ar_norm(io);
  return tpdecode::plan_all_reduce(impl_->limits(), config_.algorithm, io.x.rows, io.x.cols, true).result;
}

CommResult TpComm::plan_gather(const GatherIo& io) const {
  check_gather(io, team_.size());
  const int64_t bytes = io.shard.cols * static_cast<int64_t>(io.shard.element_size());
  return tpdecode::plan_gather(impl_->limits(), config_.algorithm, io.shard.rows, bytes, io.shard.dtype).result;
}

namespace {

// Rows [first, first + n) of a [rows, cols] view.
TensorView rows_of(TensorView t, int64_t first, int64_t n) {
  if (t.data == nullptr) return t;
  t.data = static_cast<char*>(t.data) + first * t.row_stride * static_cast<int64_t>(t.element_size());
  t.rows = n;
  return t;
}

AllReduceIo rows_of(const AllReduceIo& io, const CommCall& c) {
  return {rows_of(io.x, c.first, c.rows), rows_of(io.out, c.first, c.rows)};
}
ArNormIo rows_of(ArNormIo io, const CommCall& c) {
  io.x = rows_of(io.x, c.first, c.rows);
  io.residual = rows_of(io.residual, c.first, c.rows);
  io.out = rows_of(io.out, c.first, c.rows);
  io.residual_out = rows_of(io.residual_out, c.first, c.rows);
  if (io.quant == ArNormQuant::kGroup || io.quant == ArNormQuant::kGroupUe8m0)
    io.scale = rows_of(io.scale, c.first, c.rows);  // a static scale is one value for every row
  return io;
}
GatherIo rows_of(const GatherIo& io, const CommCall& c) {
  return {rows_of(io.shard, c.first, c.rows), rows_of(io.out, c.first, c.rows)};
}

// Each call of the plan on every driven rank's rows of it: run(path, ios).
template <class Io, class Run>
void run_plan(const CommPlan& plan, std::span<const Io> io, Run run) {
  if (plan.calls.size() == 1) {
    run(plan.calls[0].path, io);
    return;
  }
  std::vector<Io> part(io.size());
  for (const CommCall& c : plan.calls) {
    for (std::size_t i = 0; i < io.size(); ++i) part[i] = rows_of(io[i], c);
    run(c.path, std::span<const Io>(part));
  }
}

}  // namespace

CommResult TpComm::all_reduce(std::span<const AllReduceIo> io, std::span<const cudaStream_t> streams) {
  impl_->begin(io.size(), streams, "all_reduce");
  for (const AllReduceIo& a : io) check_all_reduce(a);
  check_same_shapes(io, [](const AllReduceIo& a) { return std::pair(a.x.rows, a.x.cols); }, "all_reduce");
  CommPlan plan = tpdecode::plan_all_reduce(impl_->limits(), config_.algorithm, io[0].x.rows, io[0].x.cols, false);
  run_plan(plan, io, [&](CommPath path, std::span<const AllReduceIo> part) {
    if (path == CommPath::kOneShot)
      impl_->one_shot(part, streams);
    else if (path == CommPath::kTwoShot)
      impl_->two_shot(part, streams);
    else
      impl_->stock().all_reduce(part, streams);
  });
  return std::move(plan.result);
}

CommResult TpComm::ar_norm(std::span<const ArNormIo> io, std::span<const cudaStream_t> streams) {
  impl_->begin(io.size(), streams, "ar_norm");
  for (const ArNormIo& a : io) check_ar_norm(a);
  check_same_shapes(io, [](const ArNormIo& a) { return std::tuple(a.x.rows, a.x.cols, a.quant); }, "ar_norm");
  CommPlan plan = tpdecode::plan_all_reduce(impl_->limits(), config_.algorithm, io[0].x.rows, io[0].x.cols, true);
  run_plan(plan, io, [&](CommPath path, std::span<const ArNormIo> part) {
    if (path == CommPath::kOneShot)
      impl_->ar_norm(part, streams);
    else if (path == CommPath::kTwoShot)
      impl_->two_shot_ar_norm(part, streams);
    else
      impl_->stock().ar_norm(part, streams);
  });
  return std::move(plan.result);
}

CommResult TpComm::gather(std::span<const GatherIo> io, std::span<const cudaStream_t> streams) {
  impl_->begin(io.size(), streams, "gather");
  check_same_shapes(io, [](const GatherIo& g) { return std::tuple(g.shard.rows, g.shard.cols, g.shard.dtype); },
                    "gather");
  for (const GatherIo& g : io) check_gather(g, team_.size());
  const int64_t bytes = io[0].shard.cols * static_cast<int64_t>(io[0].shard.element_size());
  CommPlan plan = tpdecode::plan_gather(impl_->limits(), config_.algorithm, io[0].shard.rows, bytes, io[0].shard.dtype);
  run_plan(plan, io, [&](CommPath path, std::span<const GatherIo> part) {
    if (path == CommPath::kOneShot)
      impl_->gather(part, streams);
    else
      impl_->stock().gather(part, streams);
  });
  return std::move(plan.result);
}

}  // namespace tpdecode
