// The ops of an MlpBlockProgram (mlp_block_program.hpp) on given intermediates: a
// host function with no device work, so the CPU tests see which ops the block runs
// and which norms fold.
#pragma once

#include <vector>

#include "tpdecode/gemm_program.hpp"
#include "tpdecode/mlp_block_program.hpp"

namespace tpdecode::program {

// The block's own buffers, each [m, cols] bf16: o (o_proj's out), h (the post norm's
// out), act (silu(gate) * up), y (down's out) and h2 (the next norm's out). Where a
// part is absent its buffer is not read (o without o_proj, y and h2 without
// next_norm, h2 without qkv: the caller's out takes their place).
struct MlpBlockScratch {
  TensorView o, h, act, y, h2;
};

struct MlpBlockOps {
  std::vector<GemmProgram::Op> ops;
  int post_norm = -1;  // the ops' indices of the norms (-1: none)
  int next_norm = -1;
};

// The intermediates' widths for a block's weights: H, I (the gate_up rows / 2).
struct MlpBlockWidths {
  int64_t hidden = 0;
  int64_t intermediate = 0;
};

// Checks the weights and buffers against each other (InvalidArgument naming the
// tensor; m from 1 to 64; out, the residual and attn pairwise disjoint) and returns
// the widths the scratch needs.
MlpBlockWidths check_mlp_block(const MlpBlockProgram::Weights& w, const MlpBlockProgram::Buffers& b, int m);

// How the block's norms take their x.
enum class MlpBlockNorms {
  kFold,      // folded where the program serves it (see mlp_block_program.hpp)
  kNormOps,   // norm ops
  // norm ops that all-reduce their x over a team first (team_mlp_block.hpp): o
  // (or attn) and y are the rank's partials of row-parallel GEMMs
  kAllReduce,
};

// The block's ops in program order.
MlpBlockOps mlp_block_ops(const MlpBlockProgram::Weights& w, const MlpBlockProgram::Buffers& b,
                          const MlpBlockScratch& s, MlpBlockNorms norms);

}  // namespace tpdecode::program
