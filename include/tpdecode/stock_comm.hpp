// The stock collectives: the fallback when DrafterComm does not serve a call, and
// the baseline the benchmarks compare against.
//  - NCCL team: ncclAllReduce into a scratch row + a separate fused add-RMSNorm
//    kernel; ncclAllGather into [TP, rows, S] + a copy to [rows, TP·S].
//  - Local team (one GPU): the equivalent without NCCL: each rank copies its
//    partial (or shard) into its symmetric staging buffer, the ranks' streams wait
//    for every copy (events), a plain kernel per rank reads all ranks' staging
//    copies (reduce in rank order, or the gather copy), then the same separate
//    norm kernel; finally every stream waits for every rank's reads so the next
//    call may overwrite the staging buffers.
// The add-RMSNorm kernel computes exactly ArNorm's math and summation order
// (ar_norm.hpp), so on the local team stock and ArNorm give identical bits. NCCL's
// all-reduce sums in its own order: its reduced row may differ from the rank-order
// sum by BF16 rounding.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <vector>

#include "tpdecode/ar_norm.hpp"
#include "tpdecode/team.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode {

struct StockCommConfig {
  int rows_cap = 64;
  int64_t max_row_bytes = 7168 * 2;  // largest per-rank row: a partial (hidden·2) or a shard
};

class StockComm {
 public:
  // Collective over the team; before any capture.
  StockComm(Team& team, const StockCommConfig& config);
  ~StockComm();
  StockComm(const StockComm&) = delete;
  StockComm& operator=(const StockComm&) = delete;

  // One call for every rank this object drives: io[i] is driven rank i's
  // (io.size() == team.driven(); the NCCL team drives one rank). Same tensors and
  // contract as ar_norm(). Throws InvalidArgument / CapacityError.
  void ar_norm(std::span<const ArNormIo> io);

  // shard[i]: driven rank i's [rows, S] (any dtype, S·element bytes a multiple of
  // 4); out[i]: [rows, TP·S] of the same dtype.
  void all_gather(std::span<const TensorView> shard, std::span<const TensorView> out);

 private:
  // Local team: copies driven rank i's rows into its staging buffer and records
  // staged_[i]; wait_for_all makes every driven rank's stream wait for `events`.
  void stage(int i, const void* rows_data, int rows, long row_bytes);
  void wait_for_all(const std::vector<cudaEvent_t>& events);

  Team& team_;
  StockCommConfig config_;
  SymmetricBuffer staging_;                 // local team: [rows_cap, max_row_bytes] per rank
  std::vector<void*> scratch_;              // per driven rank: [TP, rows_cap, max_row_bytes]
  std::vector<cudaEvent_t> staged_, read_;  // per driven rank (local team)
};

}  // namespace tpdecode
