// Launcher of the warp split-K engine (warp_splitk.cu); operands are checked by the
// caller (decode_gemm.cpp).
#pragma once

#include <cuda.h>
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

// The narrow CTAs' K partition: of a CTA's `cta_chunks` chunks, warp group `group`
// of `groups` takes chunks group, group + groups, ... (neighbouring warps read
// neighbouring columns of the same rows); how many that is. Every chunk goes to
// exactly one group (tests/cpu/gemm_rules_test.cpp).
constexpr int warp_group_chunks(int cta_chunks, int group, int groups) {
  return cta_chunks > group ? (cta_chunks - group + groups - 1) / groups : 0;
}

// A narrow CTA group's walk over its `count` chunks: position c takes chunk
// (c + rotation) mod count, rotation = walk_rotation(row block, count) (every chunk
// once; tests/cpu/gemm_rules_test.cpp). The wide CTA walks in order.
constexpr int walk_rotation(int64_t block, int count) { return count > 0 ? static_cast<int>(block % count) : 0; }
constexpr int rotated_chunk(int c, int rotation, int count) {
  return c + rotation < count ? c + rotation : c + rotation - count;
}

// Raises the kernel's dynamic shared-memory limit (host only; before any capture):
// row_tiles 4 (wide CTAs) at 1, 2, 4 or 8 token tiles, 2 or 1 (narrow) at 1 or 2,
// the tensor-map form (row_tiles 1) at 1 or 2.
void prepare_warp_splitk(int token_tiles, int row_tiles, bool tensor_map = false);

// w_map: for t.tensor_map, the weight's [2][16][64] boxes (wgmma_tile_map(w, n, k,
// 16, 2)); not read otherwise (null).
void launch_warp_splitk(const WarpSplitKParams& p, const GemmTactic& t, bool pdl, cudaStream_t stream,
                        const CUtensorMap* w_map = nullptr);

}  // namespace tpdecode
