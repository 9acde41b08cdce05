// A TeamMlpBlock's launch form (team_mlp_block.hpp): every driven rank's block as a
// DecodeGemm per linear with SiLU-mul between gate_up and down, and both all-reduce
// + residual + norms as TpComm's ar_norm over the team (its bits: ArNorm's), each
// stage launched for every driven rank on its stream before the next stage. What
// the block runs above MlpBlockProgram::kProgramMaxRows, and where the program is
// not served (a norm's share above what a rank's CTAs hold).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <span>
#include <vector>

#include "program/mlp_block_launches.hpp"
#include "tpdecode/comm.hpp"
#include "tpdecode/team.hpp"
#include "tpdecode/team_mlp_block.hpp"

namespace tpdecode::program {

class TeamMlpBlockLaunches {
 public:
  // Per driven rank its checked weights, buffers and scratch (TeamMlpBlock's). Checks
  // the norms' operands as the team's ar_norm takes them (InvalidArgument naming the
  // driven rank, before anything collective), takes the team's shared TpComm for H,
  // m rows and `comm_group` (shared_comm: made by the first such block, collective),
  // copies the GEMM weights and decides each GEMM's path for m rows; host only,
  // before any capture.
  TeamMlpBlockLaunches(Team& team, std::span<const TeamMlpBlock::Weights> weights,
                       std::span<const TeamMlpBlock::Buffers> buffers, std::span<const MlpBlockScratch> scratch, int m,
                       int comm_group);
  ~TeamMlpBlockLaunches();

  // streams[i]: driven rank i's (empty: the team's).
  void run(std::span<const cudaStream_t> streams) const;

 private:
  struct Rank {
    TeamMlpBlock::Weights w;
    TeamMlpBlock::Buffers b;
    MlpBlockScratch s;
    DeviceBuffer gate_up_out;  // [m, 2 I / tp]
    TensorView gate_up_view;
    // Why a cuBLAS context per rank: a context serves one device, and a local
    // team's ranks may each have their own.
    std::shared_ptr<CublasContext> cublas;
    MlpLinear o_proj, gate_up, down, qkv;
    bool pdl = false;
  };
  // A norm's TpComm call (the post norm's or the next's), per driven rank.
  std::vector<ArNormIo> norm_io(bool post) const;
  static ArNormIo norm_io(const TeamMlpBlock::Weights& w, const TeamMlpBlock::Buffers& b, const MlpBlockScratch& s,
                          bool post);

  TpComm* comm_ = nullptr;  // the team's (shared_comm), kept as long as the team
  std::vector<Rank> ranks_;
  std::vector<ArNormIo> post_io_, next_io_;  // norm_io's, made once
  std::vector<cudaStream_t> team_streams_;   // the team's, per driven rank
};

}  // namespace tpdecode::program
