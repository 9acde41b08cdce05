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
// Forms: the TeamProgram, or launches (form() kLaunches: per rank a DecodeGemm per
// linear and the SiLU-mul kernel, both all-reduce + residual + norms as TpComm's
// ar_norm over the team, with its bits; one TpComm the team keeps for all its blocks
// of that H, row count and comm group: a model's layers take 3 of the team's 255
// mailboxes between them, where the program form takes one per block). The block's
// choice (default_form): the program up to MlpBlockProgram::kProgramMaxRows rows
// where each rank has its GPU alone (MlpBlockProgram's threshold, measured at TP 1,
// where a rank has every SM as it has at TP > 1 with one GPU per rank), launches
// above it and wherever ranks share a GPU (a local team: there the launches measured
// faster at every row count, docs/performance.md). The program also needs a norm's
// share of a rank's CTAs within what they hold (GemmProgram::Norm: with one GPU per
// rank every row count at H 7168; 8 ranks on one H200, H 7168: up to 9 rows) and
// ranks that share memory; where it is not served, the block runs as launches
// (asked for as a program: Unavailable).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <span>

#include "tpdecode/mlp_block_program.hpp"
#include "tpdecode/team.hpp"
#include "tpdecode/team_program.hpp"

namespace tpdecode {

class TeamMlpBlock {
 public:
  using Weights = MlpBlockProgram::Weights;  // one rank's shards (above)
  using Buffers = MlpBlockProgram::Buffers;  // one rank's
  using Form = MlpBlockProgram::Form;

  // weights[i], buffers[i]: driven rank i's (team.driven() of each). Checks every
  // rank's tensors (InvalidArgument naming the rank and the tensor; every rank the
  // same H, I / tp and row count, next_norm given), then builds the form (above;
  // `form` asks for one) -- collective over the team: every rank builds its blocks,
  // in the same form, in the same order; host only, before any capture, on the
  // team's device. `comm_group` (0 or more): launch-form blocks of one group share
  // a TpComm (run()); blocks that may run at the same time, e.g. two micro-batches'
  // graphs replayed at once on other streams, need groups of their own, and a group
  // other than 0 runs as launches (the program form holds a rank's SMs and waits on
  // its peers, so two at once may wait on each other; asked for: InvalidArgument).
  TeamMlpBlock(Team& team, std::span<const Weights> weights, std::span<const Buffers> buffers, int m,
               std::optional<Form> form = std::nullopt, int comm_group = 0);
  ~TeamMlpBlock();
  TeamMlpBlock(const TeamMlpBlock&) = delete;
  TeamMlpBlock& operator=(const TeamMlpBlock&) = delete;

  // Runs every driven rank's block on streams[i] (empty: the team's streams), as
  // TeamProgram::run (the launch form: PDL where the team's options allow it and the
  // rank has its GPU alone). Launch-form blocks of one H, row count and comm group
  // share the team's TpComm (above): run them one after another on each rank (one
  // stream, or streams joined by events), as a model's layers run. Two of them
  // running at once would meet in its mailboxes: wrong values or timeouts, not an
  // argument error (nothing can tell at run time); give such blocks other groups.
  void run(std::span<const cudaStream_t> streams = {}) const;

  Form form() const;
  // The block's choice for m rows with `ranks_on_device` ranks on each GPU (above).
  static Form default_form(int m, int ranks_on_device);
  // The program (InvalidArgument where form() is kLaunches).
  const TeamProgram& program() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpdecode
