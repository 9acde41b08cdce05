// Launcher of the warp split-K engine (warp_splitk.cu); operands are checked by the
// caller (decode_gemm.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gemm/gemm_tactic.hpp"

namespace tpdecode {

struct WarpSplitKParams {
  const void* w;       // [N, K] bf16, contiguous, 16-byte aligned
  const void* x;       // [M, K] bf16, contiguous, 16-byte aligned
  void* out;           // [M, out_stride] bf16
  int m;
  int chunks;          // K / kWarpChunkK
  int64_t n;
  int64_t k;
  int64_t out_stride;  // elements
};

// Raises the kernel's dynamic shared-memory limit (host only; before any capture).
void prepare_warp_splitk(int token_tiles);

void launch_warp_splitk(const WarpSplitKParams& p, const GemmTactic& t, bool pdl, cudaStream_t stream);

}  // namespace tpdecode
