#include "program_ops.hpp"

#include <string>

namespace tpdecode::python {
namespace {

TensorView matrix(const char* who, const char* field, int device, const DLView& t) {
  return bf16_matrix(t, device, (std::string(who) + ": " + field).c_str());
}

}  // namespace

GemmProgram::Op program_gemm(const char* who, int device, const DLView& weight, const DLView& x, const DLView& out,
                             int64_t after, bool silu_mul) {
  return GemmProgram::Gemm{matrix(who, "a Gemm's weight", device, weight), matrix(who, "a Gemm's x", device, x),
                           matrix(who, "a Gemm's out", device, out), static_cast<int>(after),
                           silu_mul ? GemmProgram::Epilogue::kSiluMul : GemmProgram::Epilogue::kPlain};
}

GemmProgram::Op program_norm(const char* who, int device, const DLView& x, int64_t after, const DLView& weight,
                             double eps, const tvm::ffi::Optional<DLView>& residual,
                             const tvm::ffi::Optional<DLView>& residual_out, const DLView& out, bool folded,
                             bool all_reduce) {
  auto optional = [&](const tvm::ffi::Optional<DLView>& t, const char* field) {
    return t.has_value() ? matrix(who, field, device, t.value()) : TensorView{};
  };
  GemmProgram::Norm n{matrix(who, "a Norm's x", device, x), static_cast<int>(after),
                      matrix(who, "a Norm's weight", device, weight), static_cast<float>(eps),
                      optional(residual, "a Norm's residual"), optional(residual_out, "a Norm's residual_out"),
                      matrix(who, "a Norm's out", device, out), folded};
  n.all_reduce = all_reduce;
  return n;
}

}  // namespace tpdecode::python
