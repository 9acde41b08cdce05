#include "tpdecode/tensor.hpp"

#include <fmt/format.h>

#include "tpdecode/error.hpp"

namespace tpdecode {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kBF16: return "bf16";
    case DType::kF32: return "f32";
    case DType::kI32: return "i32";
    case DType::kE4M3: return "e4m3";
  }
  return "?";
}

std::string TensorView::describe() const {
  return fmt::format("{}[{}, {}] stride {}", dtype_name(dtype), rows, cols, row_stride);
}

void require_rows(const TensorView& t, DType dtype, int64_t cols, const char* what) {
  require(t.data != nullptr, fmt::format("{}: null pointer", what));
  require(t.dtype == dtype, fmt::format("{}: dtype {} where {} is required", what, dtype_name(t.dtype),
                                        dtype_name(dtype)));
  require(t.rows >= 1, fmt::format("{}: {} rows", what, t.rows));
  require(t.cols == cols, fmt::format("{}: {} columns where {} are required", what, t.cols, cols));
  require(t.contiguous(), fmt::format("{}: rows must be contiguous ({})", what, t.describe()));
  require(t.aligned(16), fmt::format("{}: data must be 16-byte aligned", what));
}

}  // namespace tpdecode
