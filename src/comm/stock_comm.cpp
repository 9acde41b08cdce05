#include "tpdecode/stock_comm.hpp"

#include <fmt/format.h>

#include "comm/stock_comm_launch.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/nccl_team.hpp"

namespace tpdecode {

namespace {

void require_driven(std::size_t n, const Team& team, const char* op) {
  require(static_cast<int>(n) == team.driven(),
          fmt::format("{}: {} argument sets for {} driven ranks", op, n, team.driven()));
}

}  // namespace

StockComm::StockComm(Team& team, const StockCommConfig& config) : team_(team), config_(config) {
  require(config.rows_cap >= 1 && config.max_row_bytes > 0 && config.max_row_bytes % 16 == 0,
          fmt::format("stock comm: rows_cap {} and max_row_bytes {} (a positive multiple of 16)", config.rows_cap,
                      config.max_row_bytes));
  const bool local = team.kind() == TeamKind::kLocal;
  const std::size_t row_set = static_cast<std::size_t>(config.rows_cap) * config.max_row_bytes;
  if (local) staging_ = team.allocate(row_set, 0);
  // Why TP row sets under NCCL: the all-gather's receive buffer is [TP, rows, S];
  // the local team only needs the reduced rows.
  const std::size_t scratch_bytes = row_set * (local ? 1 : team.size());
  for (int i = 0; i < team.driven(); ++i) {
    TPD_CUDA(cudaSetDevice(team.rank_context(i).device));
    void* p = nullptr;
    TPD_CUDA(cudaMalloc(&p, scratch_bytes));
    scratch_.push_back(p);
    cudaEvent_t staged, read;
    TPD_CUDA(cudaEventCreateWithFlags(&staged, cudaEventDisableTiming));
    TPD_CUDA(cudaEventCreateWithFlags(&read, cudaEventDisableTiming));
    staged_.push_back(staged);
    read_.push_back(read);
  }
}

StockComm::~StockComm() {
  for (void* p : scratch_) cudaFree(p);
  for (cudaEvent_t e : staged_) cudaEventDestroy(e);
  for (cudaEvent_t e : read_) cudaEventDestroy(e);
}

void StockComm::stage(int i, const void* rows_data, int rows, long row_bytes) {
  const RankContext& ctx = team_.rank_context(i);
  TPD_CUDA(cudaMemcpy2DAsync(staging_.local(i), static_cast<std::size_t>(config_.max_row_bytes), rows_data,
                             static_cast<std::size_t>(row_bytes), static_cast<std::size_t>(row_bytes),
                             static_cast<std::size_t>(rows), cudaMemcpyDeviceToDevice, ctx.stream));
  TPD_CUDA(cudaEventRecord(staged_[static_cast<std::size_t>(i)], ctx.stream));
}

void StockComm::wait_for_all(const std::vector<cudaEvent_t>& events) {
  for (int i = 0; i < team_.driven(); ++i)
    for (cudaEvent_t e : events) TPD_CUDA(cudaStreamWaitEvent(team_.rank_context(i).stream, e, 0));
}

void StockComm::ar_norm(std::span<const ArNormIo> io) {
  require_driven(io.size(), team_, "stock ar_norm");
  for (const ArNormIo& a : io) {
    const int64_t hidden = a.x.cols;
    require(ar_norm_hidden_supported(hidden), fmt::format("stock ar_norm: hidden size {} is not supported", hidden));
    require_rows(a.x, DType::kBF16, hidden, "stock ar_norm input");
    if (a.residual.data) require_rows(a.residual, DType::kBF16, hidden, "stock ar_norm residual");
    require_rows(a.weight, DType::kBF16, hidden, "stock ar_norm weight");
    require_rows(a.out, DType::kBF16, hidden, "stock ar_norm output");
    require_rows(a.residual_out, DType::kBF16, hidden, "stock ar_norm residual output");
    require((!a.residual.data || a.residual.rows == a.x.rows) && a.out.rows == a.x.rows &&
                a.residual_out.rows == a.x.rows && a.weight.rows == 1,
            "stock ar_norm: row counts of input, residual and outputs differ (or weight is not one row)");
    if (a.x.rows > config_.rows_cap || hidden * 2 > config_.max_row_bytes)
      throw CapacityError(fmt::format("stock ar_norm: [{}, {}] exceeds the buffers ({} rows of {} bytes)", a.x.rows,
                                      hidden, config_.rows_cap, config_.max_row_bytes));
  }
  if (team_.kind() == TeamKind::kNccl) {
    const auto& nccl = static_cast<const NcclTeam&>(team_);
    const ArNormIo& a = io[0];
    const RankContext& ctx = team_.rank_context(0);
    nccl.all_reduce_bf16(a.x.data, scratch_[0], static_cast<std::size_t>(a.x.rows * a.x.cols), ctx.stream);
    launch_add_rms_norm(ctx.stream, scratch_[0], a);
    return;
  }
  for (int i = 0; i < team_.driven(); ++i) stage(i, io[i].x.data, static_cast<int>(io[i].x.rows), io[i].x.cols * 2);
  wait_for_all(staged_);
  for (int i = 0; i < team_.driven(); ++i) {
    const RankContext& ctx = team_.rank_context(i);
    launch_stock_reduce(ctx.stream, team_.size(), staging_.peers(i), static_cast<long>(config_.max_row_bytes),
                        scratch_[static_cast<std::size_t>(i)], static_cast<int>(io[i].x.rows),
                        static_cast<int>(io[i].x.cols));
    TPD_CUDA(cudaEventRecord(read_[static_cast<std::size_t>(i)], ctx.stream));
    launch_add_rms_norm(ctx.stream, scratch_[static_cast<std::size_t>(i)], io[i]);
  }
  wait_for_all(read_);  // the next call may overwrite the staging rows
}

void StockComm::all_gather(std::span<const TensorView> shard, std::span<const TensorView> out) {
  require_driven(shard.size(), team_, "stock all_gather");
  require_driven(out.size(), team_, "stock all_gather");
  for (std::size_t i = 0; i < shard.size(); ++i) {
    const TensorView& s = shard[i];
    const int64_t bytes = s.cols * static_cast<int64_t>(s.element_size());
    require(s.data && s.rows >= 1 && s.contiguous() && bytes % 4 == 0,
            fmt::format("stock all_gather: shard must be non-null and contiguous, rows a multiple of 4 bytes ({})",
                        s.describe()));
    require(out[i].data && out[i].dtype == s.dtype && out[i].rows == s.rows && out[i].cols == s.cols * team_.size() &&
                out[i].contiguous(),
            fmt::format("stock all_gather: output {} for shard {} of a team of {}", out[i].describe(), s.describe(),
                        team_.size()));
    if (s.rows > config_.rows_cap || bytes > config_.max_row_bytes)
      throw CapacityError(fmt::format("stock all_gather: {} rows of {} bytes exceed the buffers ({} rows of {} bytes)",
                                      s.rows, bytes, config_.rows_cap, config_.max_row_bytes));
  }
  const auto rows = [&](std::size_t i) { return static_cast<int>(shard[i].rows); };
  const auto row_bytes = [&](std::size_t i) { return static_cast<long>(shard[i].cols * shard[i].element_size()); };
  if (team_.kind() == TeamKind::kNccl) {
    const auto& nccl = static_cast<const NcclTeam&>(team_);
    const RankContext& ctx = team_.rank_context(0);
    const std::size_t per_rank = static_cast<std::size_t>(rows(0)) * row_bytes(0);
    nccl.all_gather_bytes(shard[0].data, scratch_[0], per_rank, ctx.stream);
    PeerPointers src;  // [TP, rows, S]: rank r's rows at r · rows · S
    for (int r = 0; r < team_.size(); ++r) src.base[r] = static_cast<char*>(scratch_[0]) + r * per_rank;
    launch_gather_copy(ctx.stream, team_.size(), src, row_bytes(0), out[0].data, rows(0), row_bytes(0));
    return;
  }
  for (int i = 0; i < team_.driven(); ++i) stage(i, shard[i].data, rows(i), row_bytes(i));
  wait_for_all(staged_);
  for (int i = 0; i < team_.driven(); ++i) {
    const RankContext& ctx = team_.rank_context(i);
    launch_gather_copy(ctx.stream, team_.size(), staging_.peers(i), static_cast<long>(config_.max_row_bytes),
                       out[i].data, rows(i), row_bytes(i));
    TPD_CUDA(cudaEventRecord(read_[static_cast<std::size_t>(i)], ctx.stream));
  }
  wait_for_all(read_);
}

}  // namespace tpdecode
