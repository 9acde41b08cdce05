// Launcher of the wgmma engine (wgmma_engine.cu): out[M, N] = x[M, K] * W[N, K]^T
// for 1 <= M <= 64. Operands are checked by the caller (decode_gemm.cpp).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace tpdecode {

// One launch: `clusters` clusters of `split` CTAs; cluster g takes the weight's
// row blocks g, g + clusters, ... (rows() each), its CTA of rank r the r-th of
// `split` consecutive K ranges of every block.
struct WgmmaShape {
  int sub_tiles = 1;  // 64-row wgmma tiles per block and stage: 1, 2 or 4; wide: the block's rows / 8
  int tokens = 8;     // the token tile: 8, 16, 32 or 64 (>= m; wide: 64)
  int split = 1;      // CTAs per cluster (1 .. 8)
  int clusters = 1;   // <= the row blocks
  int stages = 0;     // ring depth
  bool wide = false;  // the weight tile as wgmma's B (wgmma_plan.hpp, wide_layout)
  int rows() const { return wide ? 8 * sub_tiles : 64 * sub_tiles; }  // weight rows per block
};

struct WgmmaParams {
  const void* x;       // [m, k] bf16, contiguous, 16-byte aligned
  void* out;           // [m, out_stride] bf16
  int m;
  int64_t n;
  int64_t k;           // a multiple of 64
  int64_t out_stride;  // elements
  int64_t blocks;      // ceil(n / rows per block: WgmmaShape::rows())
  int chunks;          // k / 64
};

// The tensor map of a [rows, k] bf16 operand (16-byte aligned, rows row_stride
// elements apart, a multiple of 8; 0: k) in
// boxes of [box_rows, 64] with the 128-byte swizzle (rows past the operand's arrive
// as zeros); at depth > 1, boxes of `depth` such chunks side by side in K (chunks
// past k arrive as zeros); InvalidArgument where the driver refuses it. Host only:
// the weight's is made once, the activations' at every launch (a host encoding).
CUtensorMap wgmma_tile_map(const void* operand, int64_t rows, int64_t k, int box_rows, int depth = 1,
                           int64_t row_stride = 0);

// Whether the weight-as-A kernels are built for (sub_tiles, tokens) (the wide ones:
// wgmma::wide_shape_built).
bool wgmma_shape_built(int sub_tiles, int tokens);
// Raises the kernels' dynamic shared-memory limit on the current device (host only;
// before any capture; idempotent), and whether that was done.
void prepare_wgmma();
bool wgmma_prepared();
// Clusters of s.split CTAs of the kernel of launch shape `s` (its clusters aside)
// that the current device holds at once (cudaOccupancyMaxActiveClusters; 0: none);
// the second form for a weight-as-A kernel.
int wgmma_resident_clusters(const WgmmaShape& s);
int wgmma_resident_clusters(int sub_tiles, int tokens, int split, int stages);

// w_map: wgmma_tile_map(w, n, k, s.rows()).
void launch_wgmma(const CUtensorMap& w_map, const WgmmaParams& p, const WgmmaShape& s, bool pdl,
                  cudaStream_t stream);

}  // namespace tpdecode
