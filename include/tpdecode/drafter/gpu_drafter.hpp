// The synthetic drafter on a TP team's GPUs: every driven rank's weight shards
// (generated on the device from the seed), activation buffers and GEMM objects,
// and the step (step.hpp) enqueued on the stock or the specialised path.
//  - stock: cuBLAS (CublasContext::gemm), the stock collectives (StockComm) with
//    their separate norm kernel; no programmatic dependent launch in our kernels.
//  - specialised: DecodeGemm (warp split-K, cuBLAS where it does not take the
//    shape), DrafterComm (ArNorm, Gather; StockComm where not served), programmatic
//    dependent launch between kernels where each rank has its own GPU (off on the
//    local team, whose ranks share one: src/drafter/gpu_step_ops.cpp says why).
// At TP 1 both paths run the all-reduce as its RMSNorm alone (the separate
// add-RMSNorm kernel) and have no gathers: they differ in the GEMMs and PDL.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tpdecode/drafter/config.hpp"
#include "tpdecode/drafter/step.hpp"
#include "tpdecode/team.hpp"

namespace tpdecode {
class DrafterComm;
class StockComm;
}  // namespace tpdecode

namespace tpdecode::drafter {

enum class DrafterPath { kStock, kSpecialised };
const char* path_name(DrafterPath p);  // "stock" / "specialised"

struct GpuRank;  // one driven rank's weights, buffers and GEMMs (src/drafter/gpu_rank.hpp)

class GpuDrafter {
 public:
  using Progress = std::function<void(const std::string&)>;

  // Collective over the team (under NCCL: every rank's thread); before any graph
  // capture. Builds weights for steps of up to rows_cap rows; `progress` hears
  // about the weight build.
  GpuDrafter(Team& team, const DrafterConfig& config, int rows_cap = 64, const Progress& progress = {});
  ~GpuDrafter();
  GpuDrafter(const GpuDrafter&) = delete;
  GpuDrafter& operator=(const GpuDrafter&) = delete;

  const DrafterConfig& config() const { return config_; }
  const RankShapes& shapes() const { return shapes_; }
  Team& team() const { return team_; }
  int rows_cap() const { return rows_cap_; }
  // "" when the specialised path has DrafterComm, else why not (TP 1, shape, ...).
  const std::string& comm_refusal() const { return comm_refusal_; }
  // Bytes of weights held by the driven ranks.
  std::size_t weight_bytes() const { return weight_bytes_; }

  // Host preparation for steps of m rows (DecodeGemm engines); before capture.
  void prepare(int m);
  // Enqueues one step of m rows on every driven rank: driven rank 0's stream forks
  // to the others and joins back (graph-capturable after prepare(m)). parity_base
  // alternates 0, 1 from step to step (run_step).
  void enqueue_step(DrafterPath path, int m, int parity_base, const OpFilter& filter = {});
  // Driven rank 0's stream: capture and time on it.
  cudaStream_t stream() const;

  // After the last step (waits for it): driven rank i's logits [m, vocab] (BF16
  // bits) and draft tokens [m].
  std::vector<uint16_t> logits(int driven, int m) const;
  std::vector<int32_t> tokens(int driven, int m) const;

 private:
  Team& team_;
  DrafterConfig config_;
  RankShapes shapes_;
  int rows_cap_;
  std::size_t weight_bytes_ = 0;
  std::vector<std::unique_ptr<GpuRank>> ranks_;
  std::unique_ptr<DrafterComm> comm_;
  std::string comm_refusal_;
  std::unique_ptr<StockComm> stock_;
};

}  // namespace tpdecode::drafter
