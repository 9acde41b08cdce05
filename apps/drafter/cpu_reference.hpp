// The CPU reference of the drafter step: the op sequence of step.hpp at TP 1 on
// unsharded weights regenerated on the host (weights.hpp), FP64 GEMMs and FP32
// element math, with a BF16 rounding at every point where the GPU rounds. It runs
// the reduced configuration in CI and on machines without a GPU, and is what the
// GPU logits are compared against.
//
// Norms: an all-reduce's RMSNorm follows ArNorm's summation order where ArNorm
// serves the hidden size (reference/ar_norm.hpp), else the local norm's order; the
// local RMSNorm follows kernels.cuh's order. GEMMs sum in FP64 (the GPU in FP32 in
// its own order), so GPU and CPU logits agree to a tolerance, not bitwise.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "drafter/step.hpp"

namespace tpdecode::drafter {

// The lowest index of the largest value of a BF16 row (NaN never wins; a row of
// NaN only gives 0): the argmax rule of the step.
int32_t argmax_lowest(std::span<const uint16_t> row);

// The FP32 row sum of squares in the local norm kernel's order.
float local_norm_square_sum(std::span<const uint16_t> row);

class CpuReference final : public StepOps {
 public:
  CpuReference(const DrafterConfig& config, int64_t rows);

  // One step.
  void run();
  const DrafterConfig& config() const { return config_; }
  int64_t rows() const { return rows_; }
  // [rows, buffer_cols] BF16 bits after the last run.
  const std::vector<uint16_t>& buffer(Buf b) const { return buffers_[static_cast<std::size_t>(b)]; }
  const std::vector<int32_t>& tokens() const { return tokens_out_; }
  const std::vector<int32_t>& input_tokens() const { return tokens_in_; }
  // The whole (TP 1) weight, regenerated on first use.
  const std::vector<uint16_t>& weight(WeightId id);

  void embed(const Slice& out) override;
  void gemm(WeightId weight, const Slice& x, const Slice& out) override;
  void ar_norm(const Slice& partial, bool first, WeightId norm, const Slice& out) override;
  void rms_norms(std::span<const RowNorm> norms) override;
  void attention(const Slice& q, const Slice& kv, const Slice& k_rope, const Slice& out) override;
  void silu_mul(const Slice& gate_up, const Slice& out) override;
  void gather(GatherKind kind, const Slice& shard, const Slice& out) override;
  void add(const Slice& a, const Slice& b, const Slice& out) override;
  void argmax(const Slice& logits) override;

 private:
  // Element (m, c) of a slice.
  uint16_t& at(const Slice& s, int64_t m, int64_t c);
  std::vector<uint16_t> copy_rows(const Slice& s);

  DrafterConfig config_;
  RankShapes shapes_;
  int64_t rows_;
  std::vector<std::vector<uint16_t>> buffers_;  // [Buf::kCount]
  std::vector<int32_t> tokens_in_, tokens_out_;
  std::unordered_map<uint32_t, std::vector<uint16_t>> weights_;
};

}  // namespace tpdecode::drafter
