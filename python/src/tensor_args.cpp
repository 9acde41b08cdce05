#include "tensor_args.hpp"

#include <fmt/format.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cstdint>

#include "errors.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::python {
namespace {

const char* device_text(DLDeviceType type) {
  switch (type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    case kDLCUDAHost: return "cuda host memory";
    case kDLCUDAManaged: return "cuda managed memory";
    default: return "a non-CUDA device";
  }
}

std::string shape_text(const DLView& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim(); ++i) s += fmt::format("{}{}", i ? ", " : "", t.size(i));
  return s + "]";
}

void require_aligned(const void* p, const char* what) {
  if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0)
    raise(kind::kValue, fmt::format("{} data is not 16-byte aligned (a view at an odd offset? pass a fresh tensor)", what));
}

void* data_of(const DLView& t) { return static_cast<char*>(t.data_ptr()) + t.byte_offset(); }

}  // namespace

void require_device(const DLView& t, int device, const char* what) {
  const DLDevice d = t.device();
  if (d.device_type != kDLCUDA)
    raise(kind::kValue, fmt::format("{} is on {}; a CUDA tensor is required", what,
                                    device_text(static_cast<DLDeviceType>(d.device_type))));
  if (d.device_id != device)
    raise(kind::kValue, fmt::format("{} is on cuda:{}; this object works on cuda:{}", what, d.device_id, device));
}

std::string dtype_text(DLDataType t) {
  if (t.lanes != 1) return fmt::format("a vector dtype ({} lanes)", t.lanes);
  switch (t.code) {
    case kDLBfloat: return t.bits == 16 ? "bfloat16" : fmt::format("bfloat{}", t.bits);
    case kDLFloat: return fmt::format("float{}", t.bits);
    case kDLInt: return fmt::format("int{}", t.bits);
    case kDLUInt: return t.bits == 1 ? "bool" : fmt::format("uint{}", t.bits);
    case kDLBool: return "bool";
    default: return fmt::format("dtype code {} of {} bits", t.code, t.bits);
  }
}

bool is_bf16(DLDataType t) { return t.code == kDLBfloat && t.bits == 16 && t.lanes == 1; }

void require_bf16(const DLView& t, const char* what) {
  if (!is_bf16(t.dtype()))
    raise(kind::kType, fmt::format("{} has dtype {}, bfloat16 is required", what, dtype_text(t.dtype())));
}

int element_bytes(DLDataType t) { return (t.bits * t.lanes + 7) / 8; }

int64_t last_dim(const DLView& t, const char* what) {
  if (t.ndim() < 1) raise(kind::kValue, fmt::format("{} is a scalar; a tensor of rows is required", what));
  return t.size(-1);
}

std::vector<TensorView> rank_rows(const DLView& t, int ranks, int device, DType as, const char* what) {
  require_device(t, device, what);
  if (element_bytes(t.dtype()) != static_cast<int>(dtype_size(as)))
    raise(kind::kType, fmt::format("{} has dtype {}, elements of {} bytes are required", what, dtype_text(t.dtype()),
                                   dtype_size(as)));
  const int lead = ranks > 1 ? 1 : 0;
  if (t.ndim() < lead + 1 || (lead && t.size(0) != ranks))
    raise(kind::kValue, fmt::format("{} has shape {}; on a local team of {} ranks every tensor is [{}, ..., columns] "
                                    "(one block of rows per rank)", what, shape_text(t), ranks, ranks));
  if (!t.IsContiguous()) raise(kind::kValue, fmt::format("{} must be contiguous (shape {})", what, shape_text(t)));
  const int64_t cols = t.size(-1);
  int64_t rows = 1;
  for (int i = lead; i < t.ndim() - 1; ++i) rows *= t.size(i);
  if (rows < 1 || cols < 1) raise(kind::kValue, fmt::format("{} is empty (shape {})", what, shape_text(t)));
  char* base = static_cast<char*>(data_of(t));
  require_aligned(base, what);
  const int64_t block = rows * cols * static_cast<int64_t>(dtype_size(as));
  std::vector<TensorView> views;
  for (int r = 0; r < ranks; ++r) views.push_back({base + r * block, as, rows, cols, cols});
  return views;
}

TensorView bf16_matrix(const DLView& t, int device, const char* what) {
  require_device(t, device, what);
  if (!is_bf16(t.dtype()))
    raise(kind::kType, fmt::format("{} has dtype {}, bfloat16 is required", what, dtype_text(t.dtype())));
  const int64_t cols = last_dim(t, what);
  if (t.ndim() == 2 && (t.stride(1) == 1 || cols == 1) && t.stride(0) >= cols)
    return {data_of(t), DType::kBF16, t.size(0), cols, t.stride(0)};
  if (!t.IsContiguous())
    raise(kind::kValue, fmt::format("{} must be contiguous, or 2-D with unit column stride (shape {})", what,
                                    shape_text(t)));
  return {data_of(t), DType::kBF16, t.numel() / (cols ? cols : 1), cols, cols};
}

cudaStream_t current_stream(int device) { return static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device)); }

DeviceScope::DeviceScope(int device) {
  // Why no error here: without a usable GPU the work in the scope reports it better
  // (e.g. the local team: "needs a CUDA GPU; none is visible").
  if (cudaGetDevice(&previous_) != cudaSuccess) {
    cudaGetLastError();
    previous_ = -1;
    return;
  }
  if (previous_ != device) TPD_CUDA(cudaSetDevice(device));
}

DeviceScope::~DeviceScope() {
  int now = -1;
  if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

}  // namespace tpdecode::python
