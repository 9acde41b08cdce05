// The stock collectives: what runs where the mailboxes do not serve a call, and the
// baseline of the benchmarks.
//  - NCCL team: ncclAllReduce (into a scratch row, then the separate add-RMSNorm
//    kernel for ar_norm); ncclAllGather into [TP, rows, S] + a copy to [rows, TP·S].
//    Batch-invariant: the all-reduce is an ncclAllGather of the partials into
//    [TP, rows, W] + the local team's rank-order reduce kernel (NCCL's own sum order
//    would differ from the mailboxes').
//  - Local team (one GPU): the equivalent without NCCL: each rank copies its
//    partial (or shard) into its staging buffer, every rank's stream waits for every
//    copy (events), a plain kernel per rank reads all ranks' staging copies (reduce
//    in rank order, or the gather copy), then the same norm kernel; finally every
//    stream waits for every rank's reads so the next call may overwrite the staging.
//  - TP 1: the all-reduce is the identity (a copy, or the norm kernel alone).
//  - Batch-invariant (both teams): the sums and gathered words cleaned as a mailbox
//    would (CommConfig::batch_invariant), so every path gives the same bits.
// Arguments are validated by the caller (tp_comm.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <span>
#include <vector>

#include "team/symmetric_buffer.hpp"
#include "tpdecode/comm.hpp"
#include "tpdecode/device_buffer.hpp"

namespace tpdecode {

class StockPath {
 public:
  // Collective over the team; before any capture.
  StockPath(Team& team, int rows_cap, int64_t max_row_bytes, bool batch_invariant);
  ~StockPath();
  StockPath(const StockPath&) = delete;
  StockPath& operator=(const StockPath&) = delete;

  // Throw CapacityError for rows or row bytes above the buffers.
  void all_reduce(std::span<const AllReduceIo> io, std::span<const cudaStream_t> streams);
  void ar_norm(std::span<const ArNormIo> io, std::span<const cudaStream_t> streams);
  void gather(std::span<const GatherIo> io, std::span<const cudaStream_t> streams);

 private:
  void require_fits(int64_t rows, int64_t row_bytes, const char* op) const;
  // Local team: copies driven rank i's rows into its staging buffer and records
  // staged_[i]; then every stream waits for every event of `events`.
  void stage(int i, const void* rows_data, int rows, long row_bytes, cudaStream_t stream);
  void wait_for_all(const std::vector<cudaEvent_t>& events, std::span<const cudaStream_t> streams);
  // NCCL team: where an all-gather of per_rank bytes puts each rank's part (rank r's
  // at base[r], contiguous from base[0]).
  PeerPointers gathered(std::size_t per_rank) const;
  // Reduces every driven rank's rows into `out[i]` (NCCL or staging + reduce).
  void reduce(std::span<const TensorView> x, std::span<void* const> out, std::span<const cudaStream_t> streams);

  Team& team_;
  int rows_cap_;
  int64_t max_row_bytes_;
  bool invariant_;
  SymmetricBuffer staging_;  // local team: [rows_cap, max_row_bytes] per rank
  // Per driven rank: [1, rows_cap, max_row_bytes] (local team; NCCL team: 1 + TP row
  // sets: the reduced rows, then the gathered [TP, rows, S] of a gather or of a
  // batch-invariant all-reduce).
  std::vector<DeviceBuffer> scratch_;
  std::vector<cudaEvent_t> staged_, read_;  // per driven rank (local team)
};

}  // namespace tpdecode
