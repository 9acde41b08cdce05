// y = bf16(scale * (cap > 0 ? tanh(x / cap) * cap : x)) over the first `vocab`
// columns, in FP32, one rounding. Grid (column blocks, rows).
#pragma once

#include <cuda_bf16.h>

#include "gemm/logits_epilogue_launch.hpp"

namespace tpdecode::logits {

inline constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) logits_epilogue_kernel(const LogitsEpilogueParams p) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t row = blockIdx.y;
  if (col >= p.vocab) return;
  float y = __bfloat162float(static_cast<const __nv_bfloat16*>(p.in)[row * p.in_stride + col]);
  if (p.soft_cap > 0.0f) y = tanhf(y / p.soft_cap) * p.soft_cap;
  y *= p.scale;
  static_cast<__nv_bfloat16*>(p.out)[row * p.out_stride + col] = __float2bfloat16_rn(y);
}

}  // namespace tpdecode::logits
