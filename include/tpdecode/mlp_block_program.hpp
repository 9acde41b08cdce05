// MlpBlockProgram: a dense decoder layer's stretch between two attentions at TP 1,
// built as one GemmProgram (one persistent kernel, gemm_program.hpp) up to
// kProgramMaxRows rows:
//
//   o = attn · Wo^T                                  (with o_proj; else o = attn)
//   residual += o;   h = rmsnorm(residual) * post_norm
//   a = silu(h · Wg^T) * (h · Wu^T)                  (gate_up: I gate rows, then I up rows)
//   y = a · Wd^T
//   with next_norm:  residual += y;   h' = rmsnorm(residual) * next_norm
//                    out = h' · Wqkv^T (with qkv)  or  out = h'
//   without:         out = y (the residual holds residual + o)
//
// i.e. an MLP block (norm → gate_up → SiLU·mul → down → residual + next norm) with the
// attention's output projection before it and the next layer's first projection
// after it. Each norm is folded into the GEMMs that read it (GemmProgram::Norm::
// folded) where the block's form allows it (the post norm when o_proj is given, the
// next norm when qkv is given and the post norm folds) and the program serves it
// (where it refuses a fold as Unavailable, both norms run as norm ops);
// post_norm_folded() and next_norm_folded() say which. `fold = false` keeps both as
// norm ops (their bits: reference/program_norm.hpp). The residual stream is
// bf16(residual + o), then bf16(. + y), either way (y's bits depend on the fold).
//
// Above kProgramMaxRows, where the program measured slower than the GEMMs launched
// one by one (its 32- and 64-token kernels; docs/performance.md), the block runs as launches
// (form() kLaunches): a DecodeGemm per linear, decided for m rows at build, with the
// residual add + RMSNorm kernel (ArNorm's norm: its bits) and the SiLU-mul kernel
// between them, each a programmatic dependent of the one before; no norm folds. Where
// those kernels do not serve the tensors (H a multiple of 64 up to 16384, the norms'
// [m, H] inputs and outputs contiguous and 16-byte aligned, the norm weights
// 16-byte aligned) the program runs at every row count.
//
// The buffers are fixed when the block is built (a GemmProgram's are), the
// intermediates (o, h, a, y, h') are the object's own; the GEMM weights (and the
// folded norms' weights) are copied at build, an unfolded norm's weight is read at
// every run. Everything the GemmProgram contract says holds for the program form:
// every SM of the GPU while it runs, one run at a time, bits repeatable run to run;
// the launch form runs one call at a time too, its bits repeatable for the decisions
// DecodeGemm made at build.
// A CUDA graph that captured run() replays on this object's memory, so the object
// must outlive it.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>

#include "tpdecode/gemm_program.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode {

class MlpBlockProgram {
 public:
  struct Weights {
    TensorView o_proj;     // [H, A] bf16 (A a multiple of 64), or none (null data)
    TensorView post_norm;  // [1, H] bf16
    TensorView gate_up;    // [2 I, H] bf16: the gate rows, then the up rows
    TensorView down;       // [H, I] bf16
    TensorView next_norm;  // [1, H] bf16, or none
    TensorView qkv;        // [Q, H] bf16, or none (needs next_norm)
    float eps = 1e-6f;     // both norms'
  };
  struct Buffers {
    TensorView attn;      // [m, A] with o_proj, else [m, H]
    TensorView residual;  // [m, H], read and updated in place
    TensorView out;       // [m, Q] with qkv, else [m, H]; overlaps neither attn nor residual
  };

  // The most rows the block runs as one program (above: launches, see above): the
  // program ran 2-5 % faster at 1-4 rows and 1-2 % at 8, the two within 3 % at 16,
  // the launches faster from 24 rows (1-17 %) and 1.5-1.7 x at 40-64, at two MLP
  // shapes on one H200 (docs/performance.md).
  static constexpr int kProgramMaxRows = 16;
  enum class Form { kProgram, kLaunches };

  // Checks the shapes (InvalidArgument naming the tensor), then builds the program
  // (GemmProgram's checks and refusals) or the launches (tuning the GEMMs where the
  // tuner has no decision); host only, before any capture. `form`: the form to build
  // (none: as above; kLaunches for tensors the launches do not serve:
  // InvalidArgument).
  MlpBlockProgram(const Weights& weights, const Buffers& buffers, int m, bool fold = true,
                  std::optional<Form> form = std::nullopt);
  ~MlpBlockProgram();
  MlpBlockProgram(const MlpBlockProgram&) = delete;
  MlpBlockProgram& operator=(const MlpBlockProgram&) = delete;

  // Runs the block on `stream` (graph-capturable; pdl as GemmProgram::run).
  void run(cudaStream_t stream, bool pdl = true) const;

  Form form() const;
  bool post_norm_folded() const;
  bool next_norm_folded() const;
  // The program (InvalidArgument where form() is kLaunches).
  const GemmProgram& program() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpdecode
