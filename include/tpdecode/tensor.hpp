// A small non-owning 2-D tensor view: plain pointers, no framework types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tpdecode {

// kE4M3: OCP FP8 E4M3FN (torch.float8_e4m3fn), what ar_norm's FP8 epilogues write.
enum class DType : uint8_t { kBF16, kF32, kI32, kE4M3 };

constexpr std::size_t dtype_size(DType t) { return t == DType::kBF16 ? 2 : t == DType::kE4M3 ? 1 : 4; }
const char* dtype_name(DType t);

// Row-major [rows, cols] with `row_stride` elements between rows (device memory
// unless a function says otherwise).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kBF16;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;

  static TensorView bf16(void* p, int64_t rows, int64_t cols) {
    return {p, DType::kBF16, rows, cols, cols};
  }
  static TensorView f32(void* p, int64_t rows, int64_t cols) {
    return {p, DType::kF32, rows, cols, cols};
  }
  static TensorView e4m3(void* p, int64_t rows, int64_t cols) {
    return {p, DType::kE4M3, rows, cols, cols};
  }
  std::size_t element_size() const { return dtype_size(dtype); }
  std::size_t bytes() const { return static_cast<std::size_t>(rows * cols) * element_size(); }
  bool contiguous() const { return row_stride == cols; }
  bool aligned(std::size_t bytes) const {
    return reinterpret_cast<std::uintptr_t>(data) % bytes == 0 &&
           (row_stride * static_cast<int64_t>(element_size())) % static_cast<int64_t>(bytes) == 0;
  }
  template <class T>
  T* as() const { return static_cast<T*>(data); }
  std::string describe() const;  // e.g. "bf16[4, 7168] stride 7168"
};

}  // namespace tpdecode
