// Launcher of the stream-K engine (stream_k.cu); operands and the tactic are
// checked by the caller (gemm_paths.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tpdecode/gemm_tactic.hpp"

namespace tpdecode {

struct StreamKParams {
  const void* w;       // [N, K] bf16, contiguous, 16-byte aligned
  const void* x;       // [M, K] bf16, contiguous, 16-byte aligned
  void* out;           // [M, out_stride] bf16
  float* partials;     // [ctas, 2, 32, 64] f32: split tiles' partial sums
  unsigned* counters;  // [ctas]: zero between calls
  int m;
  int stages;
  int stage_cols;
  int ctas;
  int l2_prefetch_bytes;  // per CTA: weight bytes past the ring requested into L2 before the wait
  int64_t n;
  int64_t k;
  int64_t out_stride;  // elements
  int64_t steps_per_tile;
  int64_t total_steps;
};

// Workspace the launch needs for `ctas` CTAs (floats of partials, counters).
int64_t stream_k_partial_floats(int ctas);

// Raises the kernels' shared-memory limits on the current device (host only).
void prepare_stream_k();

void launch_stream_k(const StreamKParams& p, const StreamTactic& t, bool pdl, cudaStream_t stream);

}  // namespace tpdecode
