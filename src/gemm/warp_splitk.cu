#include "core/launch.cuh"
#include "gemm/token_tiles.hpp"
#include "gemm/warp_splitk.cuh"

namespace tpdecode {
namespace {

// Calls f(kernel) for the (token tiles, row tiles) kernel: the wide CTA at every
// token tile count, the narrow ones (1 and 2 row tiles) at 1 and 2 (kWarpNarrowMaxRows).
template <class F>
void with_kernel(int token_tiles, int row_tiles, F&& f) {
  with_token_tiles(token_tiles, [&](auto tiles) {
    constexpr int kTiles = decltype(tiles)::value;
    if (row_tiles == kWarpWarps) {
      f(warp_splitk::warp_splitk_kernel<kTiles, kWarpWarps>);
      return;
    }
    if constexpr (8 * kTiles <= kWarpNarrowMaxRows) {
      if (row_tiles == 1) {
        f(warp_splitk::warp_splitk_kernel<kTiles, 1>);
        return;
      }
      if (row_tiles == 2) {
        f(warp_splitk::warp_splitk_kernel<kTiles, 2>);
        return;
      }
    }
    throw InvalidArgument("warp split-K: row tiles per CTA must be 4, or 2 or 1 up to 16 rows");
  });
}

}  // namespace

void prepare_warp_splitk(int token_tiles, int row_tiles) {
  with_kernel(token_tiles, row_tiles, [&](auto kernel) {
    TPD_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  warp_smem_bytes(token_tiles, row_tiles)));
  });
}

void launch_warp_splitk(const WarpSplitKParams& p, const GemmTactic& t, bool pdl, cudaStream_t stream) {
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(t.split), static_cast<unsigned>(t.blocks));
  s.block = dim3(warp_splitk::kThreads);
  s.smem = static_cast<std::size_t>(warp_smem_bytes(t.token_tiles, t.row_tiles));
  s.cluster = t.split;
  s.pdl = pdl;
  with_kernel(t.token_tiles, t.row_tiles, [&](auto kernel) { launch_kernel(kernel, s, stream, p); });
}

}  // namespace tpdecode
