// tpdecode.MlpBlock on the Python side: an MlpBlockProgram (mlp_block_program.hpp)
// on DLPack tensors, run on PyTorch's current stream.
#pragma once

#include <tvm/ffi/object.h>
#include <tvm/ffi/optional.h>

#include <memory>
#include <string>

#include "tensor_args.hpp"
#include "tpdecode/mlp_block_program.hpp"

namespace tpdecode::python {

class MlpBlockObj : public tvm::ffi::Object {
 public:
  int64_t device = 0;
  int64_t rows = 0;
  bool post_norm_folded = false;
  bool next_norm_folded = false;
  bool launches = false;  // MlpBlockProgram::Form::kLaunches (above its kProgramMaxRows)

  // The weights and buffers as MlpBlockProgram's (None where optional); the norms'
  // weights may be 1-D [H]. Every tensor bf16 on the residual's CUDA device. `form`:
  // "" (the block's choice), "program" or "launches".
  MlpBlockObj(tvm::ffi::Optional<DLView> o_proj, DLView post_norm, DLView gate_up, DLView down,
              tvm::ffi::Optional<DLView> next_norm, tvm::ffi::Optional<DLView> qkv, double eps, DLView attn,
              DLView residual, DLView out, bool fold, const std::string& form);

  // Runs on PyTorch's current stream: tvm-ffi takes it from a call's tensor
  // arguments, so `on` is one (any tensor of the block's device).
  void run(DLView on, bool pdl);

  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tpdecode.MlpBlock", MlpBlockObj, tvm::ffi::Object);

 private:
  std::unique_ptr<MlpBlockProgram> block_;
};

}  // namespace tpdecode::python
