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

}  // namespace tpdecode
