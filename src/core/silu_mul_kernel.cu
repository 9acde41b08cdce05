#include <cuda_bf16.h>

#include <cstdint>

#include "core/device.cuh"
#include "core/launch.cuh"
#include "core/silu_mul.cuh"
#include "core/silu_mul_launch.hpp"

namespace tpdecode {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) silu_mul_kernel(const __nv_bfloat16* gate_up, int64_t gate_up_stride,
                                                            __nv_bfloat16* out, int64_t out_stride, int rows,
                                                            int width) {
  // Why at entry: the next kernel (a GEMM) requests its weights before it waits for
  // this one; it reads nothing of ours before its own wait.
  dev::pdl_launch_dependents();
  dev::pdl_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<int64_t>(rows) * width) return;
  const int64_t m = i / width;
  const int64_t j = i % width;
  const __nv_bfloat16* row = gate_up + m * gate_up_stride;
  out[m * out_stride + j] = dev::silu_mul(__bfloat162float(row[j]), __bfloat162float(row[width + j]));
}

}  // namespace

void launch_silu_mul(cudaStream_t stream, const TensorView& gate_up, const TensorView& out, bool pdl) {
  const int64_t n = out.rows * out.cols;
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>((n + kThreads - 1) / kThreads));
  s.block = dim3(kThreads);
  s.pdl = pdl;
  launch_kernel(silu_mul_kernel, s, stream, static_cast<const __nv_bfloat16*>(gate_up.data), gate_up.row_stride,
                static_cast<__nv_bfloat16*>(out.data), out.row_stride, static_cast<int>(out.rows),
                static_cast<int>(out.cols));
}

}  // namespace tpdecode
