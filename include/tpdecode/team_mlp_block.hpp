// TeamMlpBlock: MlpBlockProgram's layer stretch (mlp_block_program.hpp) at TP > 1,
// on every rank a Team object drives, as one TeamProgram (team_program.hpp): one
// persistent kernel per rank whose two norms all-reduce their x over the team.
// Per rank, with the Megatron split of the weights:
//
//   o = attn · Wo^T               (o_proj row-parallel: [H, A / tp], attn [m, A / tp];
//                                  o is the rank's partial)
//   residual += all_reduce(o);    h = rmsnorm(residual) * post_norm
//                                 (without o_proj: all_reduce(attn), attn [m, H] being
//                                  the rank's partial, e.g. its own o-projection's)
//   a = silu(h · Wg^T) * (h · Wu^T)  (gate_up column-parallel: the rank's I / tp gate
//                                  rows, then its I / tp up rows)
//   y = a · Wd^T                  (down row-parallel: [H, I / tp]; the rank's partial)
//   residual += all_reduce(y);    h' = rmsnorm(residual) * next_norm
//   out = h' · Wqkv^T             (with qkv, column-parallel: the rank's Q / tp rows)
//    or out = h'
//
// next_norm is required (the block's y is a partial: the all-reduce + residual +
// norm is where it becomes the layer's output; the last layer's is the final norm).
// The norm weights and the residual stream are the full [1, H] / [m, H] on every rank
// (the residual replicated: every rank stores the same bits into its own copy).
//
// Bits: each all-reduce is the one-shot's (FP32 in rank order, one BF16 rounding),
// each norm the program norm's; every rank's residual and h' are the same bits, run
// after run. No norm folds (an all-reducing norm does not). What GemmProgram and
// TeamProgram say of buffers, weights (copied at build), SMs (each rank on its GPU's
// SMs divided by the ranks sharing it), failure (a rank that never arrives:
// TimeoutError through the team, outputs NaN, Team::reset()) and capture holds.
//
// Every row count from 1 to 64 runs as the program (MlpBlockProgram's launch form
// above 16 rows has no team counterpart yet: at TP 1 those launches measured faster
// from 24 rows, docs/performance.md), within the program norm's share per CTA
// (GemmProgram::Norm): with one GPU per rank every row count at H 7168; ranks sharing
// a GPU have fewer CTAs each (8 on one H200: H 7168 up to 9 rows), beyond it
// Unavailable.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <span>

#include "tpdecode/mlp_block_program.hpp"
#include "tpdecode/team.hpp"
#include "tpdecode/team_program.hpp"

namespace tpdecode {

class TeamMlpBlock {
 public:
  using Weights = MlpBlockProgram::Weights;  // one rank's shards (above)
  using Buffers = MlpBlockProgram::Buffers;  // one rank's

  // weights[i], buffers[i]: driven rank i's (team.driven() of each). Checks every
  // rank's tensors (InvalidArgument naming the rank and the tensor; every rank the
  // same H, I / tp and row count, next_norm given), then builds the TeamProgram
  // (collective over the team: every rank builds its blocks in the same order; host
  // only, before any capture, on the team's device).
  TeamMlpBlock(Team& team, std::span<const Weights> weights, std::span<const Buffers> buffers, int m);
  ~TeamMlpBlock();
  TeamMlpBlock(const TeamMlpBlock&) = delete;
  TeamMlpBlock& operator=(const TeamMlpBlock&) = delete;

  // Runs every driven rank's block on streams[i] (empty: the team's streams), as
  // TeamProgram::run.
  void run(std::span<const cudaStream_t> streams = {}) const;

  const TeamProgram& program() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpdecode
