// DLPack tensors (PyTorch's or any framework's, through tvm-ffi) as tpdecode
// TensorViews, and the stream and device of a call. Every check fails with the
// reason: ValueError (device, shape, layout, alignment) or TypeError (dtype).
#pragma once

#include <cuda_runtime_api.h>
#include <tvm/ffi/container/tensor.h>

#include <string>
#include <vector>

#include "tpdecode/tensor.hpp"

namespace tpdecode::python {

using DLView = tvm::ffi::TensorView;

// PyTorch's name of a DLPack dtype ("bfloat16", "float16", "float32", ...).
std::string dtype_text(DLDataType t);
bool is_bf16(DLDataType t);
// TypeError naming `what` unless t is bf16.
void require_bf16(const DLView& t, const char* what);
// Bytes of one element.
int element_bytes(DLDataType t);

// Elements of the last dimension (ValueError for a 0-d tensor).
int64_t last_dim(const DLView& t, const char* what);

// `t` as `ranks` blocks of rows viewed as `as` (an equal element size): ranks > 1
// takes a leading dimension of `ranks` (the local team's ranks); ranks == 1
// flattens every dimension but the last into rows. Requires a contiguous tensor on
// CUDA device `device`, its data 16-byte aligned.
std::vector<TensorView> rank_rows(const DLView& t, int ranks, int device, DType as, const char* what);

// `t` as one bf16 matrix: 2-D with unit column stride (any row stride), or
// contiguous of any rank with every dimension but the last flattened into rows.
TensorView bf16_matrix(const DLView& t, int device, const char* what);

// ValueError unless t is on CUDA device `device`.
void require_device(const DLView& t, int device, const char* what);

// The stream tvm-ffi was handed for this call: PyTorch's current stream on
// `device` when the arguments are torch tensors.
cudaStream_t current_stream(int device);

// Makes `device` current for a scope and restores the caller's device after
// (tpdecode's team code sets devices; PyTorch's current device must not move).
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace tpdecode::python
