// An MlpBlockProgram's launch form (mlp_block_program.hpp): the block as a DecodeGemm
// per linear with the residual add + RMSNorm and SiLU-mul kernels between them, each
// launch a programmatic dependent of the one before. What the block runs above
// MlpBlockProgram::kProgramMaxRows, where the program measured slower than these
// launches (docs/performance.md).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "program/mlp_block_ops.hpp"
#include "tpdecode/decode_gemm.hpp"
#include "tpdecode/device_buffer.hpp"
#include "tpdecode/mlp_block_program.hpp"

namespace tpdecode::program {

// Whether the launch form serves these tensors: the norm kernel's rows (H a multiple
// of 64 up to 16384; the [m, H] tensors it reads or writes contiguous and 16-byte
// aligned, the norms' weights 16-byte aligned). The scratch is the block's own.
bool launches_serve(const MlpBlockProgram::Weights& w, const MlpBlockProgram::Buffers& b);

// A linear of a block's launches: a copy of its weight and the DecodeGemm on it, its
// path decided for m rows as a link between PDL kernels (null: the block has none).
struct MlpLinear {
  DeviceBuffer weight;
  std::unique_ptr<DecodeGemm> gemm;
};
MlpLinear mlp_linear(const TensorView& w, int m, const std::shared_ptr<CublasContext>& cublas);

class MlpBlockLaunches {
 public:
  // Copies the GEMM weights and decides each GEMM's path for m rows (host only,
  // before any capture; it times the candidates where the tuner has no decision).
  MlpBlockLaunches(const MlpBlockProgram::Weights& w, const MlpBlockProgram::Buffers& b, const MlpBlockScratch& s,
                   int m);
  // One run at a time (the GEMMs' PDL setting is the run's).
  void run(cudaStream_t stream, bool pdl) const;

 private:
  MlpBlockProgram::Weights w_;
  MlpBlockProgram::Buffers b_;
  MlpBlockScratch s_;
  int m_;
  DeviceBuffer gate_up_out_;  // [m, 2 I]
  TensorView gate_up_view_;   // of gate_up_out_
  TensorView down_out_;       // y with the next norm, else the block's out
  std::shared_ptr<CublasContext> cublas_;
  MlpLinear o_proj_, gate_up_, down_, qkv_;
};

}  // namespace tpdecode::program
