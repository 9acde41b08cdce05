// One driven rank's share of the GPU drafter: weight shards, activation buffers,
// input tokens and the GEMM objects (shared by gpu_drafter.cpp and gpu_step_ops.cpp).
#pragma once

#include <array>
#include <memory>
#include <unordered_map>

#include "tpdecode/cublas_context.hpp"
#include "tpdecode/decode_gemm.hpp"
#include "tpdecode/device_buffer.hpp"
#include "drafter/step.hpp"
#include "tpdecode/team.hpp"

namespace tpdecode::drafter {

struct GpuRank {
  int driven = 0;
  int rank = 0;
  int device = 0;
  cudaStream_t stream = nullptr;  // the team's stream of this rank
  std::unordered_map<uint32_t, DeviceBuffer> weight_memory;  // WeightId::key() -> shard
  std::unordered_map<uint32_t, TensorView> weights;          // [shard rows, shard cols] bf16
  std::array<DeviceBuffer, static_cast<std::size_t>(Buf::kCount)> buffers;  // [rows_cap, buffer_cols] bf16
  std::array<int64_t, static_cast<std::size_t>(Buf::kCount)> buffer_cols{};
  DeviceBuffer tokens_in;   // [rows_cap] int32
  DeviceBuffer tokens_out;  // [rows_cap] int32
  int64_t vocab0 = 0;       // first token of this rank's embedding rows
  std::shared_ptr<CublasContext> cublas;                     // one per rank stream
  std::unordered_map<uint32_t, std::unique_ptr<DecodeGemm>> gemms;  // linear weights

  const TensorView& weight(WeightId id) const { return weights.at(id.key()); }
  // The first m rows of a slice: [m, s.cols] with the buffer's row stride.
  TensorView view(const Slice& s, int m) const {
    const int64_t cols = buffer_cols[static_cast<std::size_t>(s.buf)];
    auto* base = static_cast<uint16_t*>(buffers[static_cast<std::size_t>(s.buf)].get());
    return {base + s.col0, DType::kBF16, m, s.cols, cols};
  }
};

}  // namespace tpdecode::drafter
