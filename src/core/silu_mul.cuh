// SiLU(gate) * up, the gated activation of an MLP block, in one definition that the
// SiLU-mul kernel (silu_mul_launch.hpp) and the GEMM program both use, so
// that folding it into the down projection's x load changes no bit: FP32 from the
// BF16 inputs, SiLU as gate / (1 + exp(-gate)) with correctly rounded division and
// product (no contraction), one BF16 rounding.
#pragma once

#include <cuda_bf16.h>

namespace tpdecode::dev {

__device__ __forceinline__ __nv_bfloat16 silu_mul(float gate, float up) {
  return __float2bfloat16_rn(__fmul_rn(__fdiv_rn(gate, __fadd_rn(1.0f, expf(-gate))), up));
}

}  // namespace tpdecode::dev
