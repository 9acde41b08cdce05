// Launcher of the direct engine (direct_gemm.cu); operands and the tactic are
// checked by the caller (gemm_paths.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tpdecode/gemm_tactic.hpp"

namespace tpdecode {

struct DirectParams {
  const void* w;       // [N, K] bf16, contiguous, 16-byte aligned
  const void* x;       // [M, K] bf16, contiguous, 16-byte aligned
  void* out;           // [M, out_stride] bf16
  float* partials;     // [workers, 2, 8 tokens, 16 rows] f32: split tiles' partial sums
  unsigned* counters;  // [workers]: zero between calls
  int m;
  int workers;
  int l2_prefetch_steps;  // per warp, past its first request
  int64_t k;
  int64_t out_stride;  // elements
  int64_t steps_per_tile;
  int64_t total_steps;
};

void launch_direct(const DirectParams& p, const DirectTactic& t, bool pdl, cudaStream_t stream);

}  // namespace tpdecode
