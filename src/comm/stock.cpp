#include "comm/stock.hpp"

#include "comm/kernels.hpp"
#include "core/check.hpp"
#include "team/rank_context.hpp"
#include "team/team_internals.hpp"
#include "tpdecode/nccl_team.hpp"

namespace tpdecode {

StockPath::StockPath(Team& team, int rows_cap, int64_t max_row_bytes, bool batch_invariant)
    : team_(team), rows_cap_(rows_cap), max_row_bytes_(max_row_bytes), invariant_(batch_invariant) {
  const bool local = team.kind() == TeamKind::kLocal;
  const std::size_t row_set = static_cast<std::size_t>(rows_cap) * max_row_bytes;
  if (local && team.size() > 1)
    staging_ =
        allocate_symmetric_buffer(team, row_set, 0, fmt::format("stock staging {}x{} B", rows_cap, max_row_bytes));
  // Why 1 + TP row sets under NCCL: the all-gather's receive buffer is [TP, rows, S],
  // beside the reduced rows an ar_norm normalises.
  const std::size_t scratch_bytes = row_set * (local ? 1 : 1 + team.size());
  for (int i = 0; i < team.driven(); ++i) {
    TPD_CUDA(cudaSetDevice(team.device(i)));
    scratch_.emplace_back(scratch_bytes);
    cudaEvent_t staged, read;
    TPD_CUDA(cudaEventCreateWithFlags(&staged, cudaEventDisableTiming));
    TPD_CUDA(cudaEventCreateWithFlags(&read, cudaEventDisableTiming));
    staged_.push_back(staged);
    read_.push_back(read);
  }
}

StockPath::~StockPath() {
  for (cudaEvent_t e : staged_) cudaEventDestroy(e);
  for (cudaEvent_t e : read_) cudaEventDestroy(e);
}

void StockPath::require_fits(int64_t rows, int64_t row_bytes, const char* op) const {
  check<CapacityError>(rows <= rows_cap_ && row_bytes <= max_row_bytes_,
                       "stock {}: {} rows of {} bytes exceed the buffers ({} rows of {} bytes)", op, rows, row_bytes,
                       rows_cap_, max_row_bytes_);
}

PeerPointers StockPath::gathered(std::size_t per_rank) const {
  PeerPointers p;  // [TP, rows, S] after the reduced row set: rank r's rows at (1 + r) · row set
  const std::size_t row_set = static_cast<std::size_t>(rows_cap_) * static_cast<std::size_t>(max_row_bytes_);
  for (int r = 0; r < team_.size(); ++r) p.base[r] = scratch_[0].as<char>() + row_set + r * per_rank;
  return p;
}

void StockPath::stage(int i, const void* rows_data, int rows, long row_bytes, cudaStream_t stream) {
  TPD_CUDA(cudaMemcpy2DAsync(staging_.local(i), static_cast<std::size_t>(max_row_bytes_), rows_data,
                             static_cast<std::size_t>(row_bytes), static_cast<std::size_t>(row_bytes),
                             static_cast<std::size_t>(rows), cudaMemcpyDeviceToDevice, stream));
  TPD_CUDA(cudaEventRecord(staged_[static_cast<std::size_t>(i)], stream));
}

void StockPath::wait_for_all(const std::vector<cudaEvent_t>& events, std::span<const cudaStream_t> streams) {
  for (cudaStream_t s : streams)
    for (cudaEvent_t e : events) TPD_CUDA(cudaStreamWaitEvent(s, e, 0));
}

void StockPath::reduce(std::span<const TensorView> x, std::span<void* const> out,
                       std::span<const cudaStream_t> streams) {
  const int rows = static_cast<int>(x[0].rows);
  const int width = static_cast<int>(x[0].cols);
  require_fits(rows, width * 2, "all_reduce");
  if (team_.size() == 1) {
    if (out[0] != x[0].data)
      TPD_CUDA(cudaMemcpyAsync(out[0], x[0].data, x[0].bytes(), cudaMemcpyDeviceToDevice, streams[0]));
    return;
  }
  if (team_.kind() == TeamKind::kNccl) {
    const auto& nccl = static_cast<const NcclTeam&>(team_);
    if (!invariant_) {
      nccl.all_reduce_bf16(x[0].data, out[0], x[0].bytes() / 2, streams[0]);
      return;
    }
    // Why not ncclAllReduce: its order of additions is not the mailboxes' rank order.
    const PeerPointers src = gathered(x[0].bytes());
    nccl.all_gather_bytes(x[0].data, src.base[0], x[0].bytes(), streams[0]);
    launch_stock_reduce(streams[0], team_.size(), src, width * 2L, out[0], rows, width, true);
    return;
  }
  for (int i = 0; i < team_.driven(); ++i) stage(i, x[i].data, rows, width * 2L, streams[i]);
  wait_for_all(staged_, streams);
  for (int i = 0; i < team_.driven(); ++i) {
    launch_stock_reduce(streams[i], team_.size(), staging_.peers(i), static_cast<long>(max_row_bytes_), out[i], rows,
                        width, invariant_);
    TPD_CUDA(cudaEventRecord(read_[static_cast<std::size_t>(i)], streams[i]));
  }
  wait_for_all(read_, streams);  // the next call may overwrite the staging rows
}

void StockPath::all_reduce(std::span<const AllReduceIo> io, std::span<const cudaStream_t> streams) {
  std::vector<TensorView> x;
  std::vector<void*> out;
  for (const AllReduceIo& a : io) {
    x.push_back(a.x);
    out.push_back(a.out.data);
  }
  reduce(x, out, streams);
}

void StockPath::ar_norm(std::span<const ArNormIo> io, std::span<const cudaStream_t> streams) {
  std::vector<TensorView> x;
  std::vector<void*> reduced;
  for (std::size_t i = 0; i < io.size(); ++i) {
    x.push_back(io[i].x);
    // Why TP 1 reads x itself: its all-reduce is the identity.
    reduced.push_back(team_.size() == 1 ? io[i].x.data : scratch_[i].get());
  }
  if (team_.size() > 1) reduce(x, reduced, streams);
  for (std::size_t i = 0; i < io.size(); ++i) {
    const ArNormIo& a = io[i];
    const NormIo n{reduced[i], ar_norm_tail(a), static_cast<int>(a.x.cols)};
    // Why PDL only at TP 1: there the norm is the whole op, a link between the
    // caller's kernels; after a reduce it follows a stock kernel, which never
    // triggers its dependents early.
    const RankContext& ctx = rank_context(team_, static_cast<int>(i));
    const bool pdl = team_.size() == 1 && ctx.pdl_on_own_gpu();
    launch_add_rms_norm(streams[i], n, static_cast<int>(a.x.rows), pdl);
  }
}

void StockPath::gather(std::span<const GatherIo> io, std::span<const cudaStream_t> streams) {
  const int rows = static_cast<int>(io[0].shard.rows);
  const long row_bytes = static_cast<long>(io[0].shard.cols * io[0].shard.element_size());
  require_fits(rows, row_bytes, "gather");
  if (team_.size() == 1) {
    if (io[0].out.data != io[0].shard.data)
      TPD_CUDA(cudaMemcpyAsync(io[0].out.data, io[0].shard.data, io[0].shard.bytes(), cudaMemcpyDeviceToDevice,
                               streams[0]));
    return;
  }
  // Why never i32: the mailbox does not serve it, so every path moves it as it is.
  const bool clean = invariant_ && io[0].shard.dtype != DType::kI32;
  if (team_.kind() == TeamKind::kNccl) {
    const std::size_t per_rank = static_cast<std::size_t>(rows) * row_bytes;
    const PeerPointers src = gathered(per_rank);
    static_cast<const NcclTeam&>(team_).all_gather_bytes(io[0].shard.data, src.base[0], per_rank, streams[0]);
    launch_gather_copy(streams[0], team_.size(), src, row_bytes, io[0].out.data, rows, row_bytes, clean);
    return;
  }
  for (int i = 0; i < team_.driven(); ++i) stage(i, io[i].shard.data, rows, row_bytes, streams[i]);
  wait_for_all(staged_, streams);
  for (int i = 0; i < team_.driven(); ++i) {
    launch_gather_copy(streams[i], team_.size(), staging_.peers(i), static_cast<long>(max_row_bytes_), io[i].out.data,
                       rows, row_bytes, clean);
    TPD_CUDA(cudaEventRecord(read_[static_cast<std::size_t>(i)], streams[i]));
  }
  wait_for_all(read_, streams);
}

}  // namespace tpdecode
