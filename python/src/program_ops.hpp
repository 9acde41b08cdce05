// A program's ops (GemmProgram::Gemm and ::Norm) from DLPack tensors, for the
// Python objects that build programs (GemmProgramObj, TeamProgramObj). Every check
// names the tensor with `who` ("GemmProgram", "TeamProgram") before the op's field.
#pragma once

#include <tvm/ffi/optional.h>

#include <cstdint>

#include "tensor_args.hpp"
#include "tpdecode/gemm_program.hpp"

namespace tpdecode::python {

GemmProgram::Op program_gemm(const char* who, int device, const DLView& weight, const DLView& x, const DLView& out,
                             int64_t after, bool silu_mul);
GemmProgram::Op program_norm(const char* who, int device, const DLView& x, int64_t after, const DLView& weight,
                             double eps, const tvm::ffi::Optional<DLView>& residual,
                             const tvm::ffi::Optional<DLView>& residual_out, const DLView& out, bool folded,
                             bool all_reduce);

}  // namespace tpdecode::python
