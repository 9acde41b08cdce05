// The GPU backends of the step's ops (step.hpp): each op launched for every driven
// rank on its stream, on the stock or the specialised path (gpu_drafter.hpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "drafter/gpu_drafter.hpp"
#include "drafter/gpu_rank.hpp"
#include "tpdecode/comm.hpp"
#include "tpdecode/oproj.hpp"

namespace tpdecode::drafter {

class GpuStepOps final : public StepOps {
 public:
  // `comm`'s algorithm is set by the caller (kStock on the stock path). `oprojs`:
  // every layer's fused o-projection (empty where the team has none); the
  // specialised path runs it where its kind for m rows is not unfused.
  GpuStepOps(const DrafterConfig& config, const RankShapes& shapes, const std::vector<std::unique_ptr<GpuRank>>& ranks,
             TpComm& comm, const std::vector<std::unique_ptr<PreparedOproj>>& oprojs, DrafterPath path, int m,
             bool shared_gpu);

  void embed(const Slice& out) override;
  void gemm(WeightId weight, const Slice& x, const Slice& out) override;
  void ar_norm(const Slice& partial, bool first, WeightId norm, const Slice& out) override;
  void oproj_ar_norm(WeightId weight, const Slice& x, const Slice& partial, WeightId norm, const Slice& out) override;
  void rms_norms(std::span<const RowNorm> norms) override;
  void attention(const Slice& q, const Slice& kv, const Slice& k_rope, const Slice& out) override;
  void silu_mul(const Slice& gate_up, const Slice& out) override;
  void gather(GatherKind kind, const Slice& shard, const Slice& out) override;
  void add(const Slice& a, const Slice& b, const Slice& out) override;
  void argmax(const Slice& logits) override;

  // The paths the collectives took, e.g. "one-shot 6, stock 2, oproj producer-consumer 5 (why ...)".
  std::string comm_paths() const;

 private:
  bool specialised() const { return path_ == DrafterPath::kSpecialised; }
  // Whether our kernels and DecodeGemm launch with programmatic dependent launch.
  bool pdl() const;
  void note(const CommResult& r);

  const DrafterConfig& config_;
  const RankShapes& shapes_;
  const std::vector<std::unique_ptr<GpuRank>>& ranks_;
  TpComm& comm_;
  const std::vector<std::unique_ptr<PreparedOproj>>& oprojs_;
  DrafterPath path_;
  int m_;
  bool shared_gpu_;
  std::vector<cudaStream_t> streams_;  // per driven rank
  int paths_[3] = {};                  // calls per CommPath
  int oproj_kinds_[4] = {};            // o-projections per OprojKind (unfused: a PreparedOproj declined)
  std::string first_why_;              // why the first stock call was not served
  std::string oproj_why_;              // why the first declined o-projection did not fuse
};

}  // namespace tpdecode::drafter
