// The GPU backends of the step's ops (step.hpp): each op launched for every driven
// rank on its stream, on the stock or the specialised path (gpu_drafter.hpp).
#pragma once

#include <memory>
#include <vector>

#include "drafter/gpu_rank.hpp"
#include "tpdecode/drafter/gpu_drafter.hpp"
#include "tpdecode/drafter_comm.hpp"
#include "tpdecode/stock_comm.hpp"

namespace tpdecode::drafter {

class GpuStepOps final : public StepOps {
 public:
  // comm may be null (TP 1, or not built); stock is null at TP 1.
  GpuStepOps(const DrafterConfig& config, const RankShapes& shapes, const std::vector<std::unique_ptr<GpuRank>>& ranks,
             DrafterComm* comm, StockComm* stock, DrafterPath path, int m);

  void embed(const Slice& out) override;
  void gemm(WeightId weight, const Slice& x, const Slice& out) override;
  void ar_norm(const Slice& partial, bool first, WeightId norm, const Slice& out, int parity) override;
  void rms_norm(const Slice& x, WeightId norm, const Slice& out) override;
  void attention(const Slice& q, const Slice& kv, const Slice& k_rope, const Slice& out) override;
  void silu_mul(const Slice& gate_up, const Slice& out) override;
  void gather(GatherKind kind, const Slice& shard, const Slice& out, int parity) override;
  void add(const Slice& a, const Slice& b, const Slice& out) override;
  void argmax(const Slice& logits) override;

 private:
  bool specialised() const { return path_ == DrafterPath::kSpecialised; }
  // Whether our kernels and DecodeGemm launch with programmatic dependent launch.
  bool pdl() const;
  // Whether the step offers its collectives to DrafterComm (which may still say
  // "not served": the stock collective runs then).
  bool offer_to_comm() const;

  const DrafterConfig& config_;
  const RankShapes& shapes_;
  const std::vector<std::unique_ptr<GpuRank>>& ranks_;
  DrafterComm* comm_;
  StockComm* stock_;
  DrafterPath path_;
  int m_;
  bool shared_gpu_;  // several ranks' kernels on one GPU (the local team)
};

}  // namespace tpdecode::drafter
