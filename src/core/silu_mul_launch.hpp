// The SiLU-mul kernel: an MLP's gated activation from a stored gate_up, as a launch
// of its own (the drafter's step and the MLP block's launch form run it; the GEMM
// program computes the same bits in its epilogue: core/silu_mul.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include "tpdecode/tensor.hpp"

namespace tpdecode {

// out[:, j] = BF16(SiLU(g) · u), g = gate_up[:, j], u = gate_up[:, I + j], I = out.cols;
// bf16 [rows, 2 I] and [rows, I], any row strides (checked by the caller). `pdl`:
// a programmatic dependent launch (the kernel lets its successor launch at entry and
// waits for its predecessor before reading).
void launch_silu_mul(cudaStream_t stream, const TensorView& gate_up, const TensorView& out, bool pdl);

}  // namespace tpdecode
