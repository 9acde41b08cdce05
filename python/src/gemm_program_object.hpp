// tpdecode.GemmProgram on the Python side: a GemmProgram (gemm_program.hpp) built op
// by op from DLPack tensors, run on PyTorch's current stream.
#pragma once

#include <tvm/ffi/object.h>
#include <tvm/ffi/optional.h>

#include <memory>
#include <vector>

#include "tensor_args.hpp"
#include "tpdecode/gemm_program.hpp"

namespace tpdecode::python {

class GemmProgramObj : public tvm::ffi::Object {
 public:
  int64_t device = -1;  // set by the first op (its x's device)
  int64_t ops = 0;
  int64_t rows = 0;     // 0 until built

  // Ops in program order (GemmProgram::Gemm and ::Norm; after -1: x an input). An
  // all-reducing norm is refused at build (it needs a TeamProgram).
  void add_gemm(DLView weight, DLView x, DLView out, int64_t after, bool silu_mul);
  void add_norm(DLView x, int64_t after, DLView weight, double eps, tvm::ffi::Optional<DLView> residual,
                tvm::ffi::Optional<DLView> residual_out, DLView out, bool folded, bool all_reduce);
  // Checks and plans every op, packs the weights (host work; not under capture).
  void build(int64_t m);
  // Runs on PyTorch's current stream, taken from `on` (any tensor of the device).
  void run(DLView on, bool pdl);

  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tpdecode.GemmProgram", GemmProgramObj, tvm::ffi::Object);

 private:
  int set_device(const DLView& x);
  std::vector<GemmProgram::Op> pending_;
  std::unique_ptr<GemmProgram> program_;
};

}  // namespace tpdecode::python
