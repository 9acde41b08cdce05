// bench chain's layer glue (--silu-mul, --norms): what runs between a drafter layer's
// GEMMs (layer_shapes: qkv_a, q_b, o_proj, gate_up, down) at TP 1, in the launch
// forms as the drafter's kernels and in the program form as ops of the program:
//  - --silu-mul: down reads silu(gate) * up of gate_up's out: the SiLU-mul kernel
//    (core/silu_mul_launch.hpp) between the two; in the program, gate_up's SiLU-mul
//    epilogue;
//  - --norms: after qkv_a its q_a and kv norms (the drafter's two-norm kernel), which
//    q_b reads; after o_proj and after down the residual add + RMSNorm (the TP 1
//    ArNorm kernel, launch_add_rms_norm) on one residual stream, which gate_up and
//    the next layer's qkv_a read; in the program, Norm ops (the stream in place),
//    with --fold-norms folded into the GEMMs that read them (q_a's, and the residual
//    adds but after a chain's last down, which no GEMM reads).
// Per layer its own glue buffers (a program's outs may not overlap).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "gemm_shapes.hpp"
#include "tpdecode/device_buffer.hpp"
#include "tpdecode/gemm_program.hpp"

namespace tpdecode::cli {

class ChainGlue {
 public:
  // layers: of every chain together; chain_layers: of one chain.
  ChainGlue(const std::vector<GemmShape>& layer, int layers, int chain_layers, int max_m, bool silu_mul, bool norms,
            bool fold_norms, cudaStream_t stream);

  bool silu_mul() const { return silu_mul_; }
  bool norms() const { return norms_; }

  // Link `i` of a chain of layers (i / layer size: the layer, counted over sets)
  // in the launch forms: the x it reads (the glue's output, else `input`), the glue
  // before it (the SiLU-mul from the previous link's out) and after it (the norms
  // of its out). pdl: the glue kernels' (ours: as the drafter's specialised path).
  TensorView x(std::size_t i, int m, const TensorView& input) const;
  void before(std::size_t i, int m, const TensorView& previous_out, cudaStream_t stream, bool pdl) const;
  void after(std::size_t i, int m, const TensorView& out, cudaStream_t stream, bool pdl) const;

  // Program form: whether link i ends with the SiLU-mul epilogue (the next is a down),
  // and the ops that follow link i's op (its index `op` in the program): the norms
  // of its out. The op whose out the next GEMM reads: the last norm, else `op`.
  bool silu_epilogue(std::size_t next) const;
  int append_norms(std::size_t i, int m, int op, const TensorView& out, std::vector<GemmProgram::Op>& ops) const;

 private:
  enum Position : std::size_t { kQkvA = 0, kQb = 1, kOproj = 2, kGateUp = 3, kDown = 4 };
  struct Layer {
    DeviceBuffer act, qa, kv, hidden, hidden2;  // [max_m, ·] bf16
  };
  const Layer& layer_of(std::size_t i) const { return per_layer_[(i / layer_size_) % per_layer_.size()]; }
  Position position(std::size_t i) const { return static_cast<Position>(i % layer_size_); }
  TensorView view(const DeviceBuffer& b, int m, int64_t cols) const;

  std::size_t layer_size_;
  int64_t q_lora_, kv_lora_, hidden_, intermediate_;
  int chain_layers_;
  bool silu_mul_, norms_, fold_norms_;
  float eps_ = 1e-6f;
  std::vector<Layer> per_layer_;
  DeviceBuffer residual_;                       // [max_m, hidden]
  DeviceBuffer q_norm_, kv_norm_, post_norm_, input_norm_;  // the norms' weights
};

}  // namespace tpdecode::cli
