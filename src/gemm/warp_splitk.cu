#include "core/launch.cuh"
#include "gemm/token_tiles.hpp"
#include "gemm/warp_splitk.cuh"

namespace tpdecode {
namespace {

// Calls f(kernel) for the (token tiles, row tiles, form) kernel: the wide CTA at every
// token tile count, the narrow ones (1 and 2 row tiles) at 1 and 2 (kWarpNarrowMaxRows),
// the one-tile CTA's tensor-map form too.
template <class F>
void with_kernel(int token_tiles, int row_tiles, bool tensor_map, F&& f) {
  with_token_tiles(token_tiles, [&](auto tiles) {
    constexpr int kTiles = decltype(tiles)::value;
    if (row_tiles == kWarpWarps && !tensor_map) {
      f(warp_splitk::warp_splitk_kernel<kTiles, kWarpWarps, false>);
      return;
    }
    if constexpr (8 * kTiles <= kWarpNarrowMaxRows) {
      if (row_tiles == 1) {
        if (tensor_map)
          f(warp_splitk::warp_splitk_kernel<kTiles, 1, true>);
        else
          f(warp_splitk::warp_splitk_kernel<kTiles, 1, false>);
        return;
      }
      if (row_tiles == 2 && !tensor_map) {
        f(warp_splitk::warp_splitk_kernel<kTiles, 2, false>);
        return;
      }
    }
    throw InvalidArgument(
        "warp split-K: row tiles per CTA must be 4, or 2 or 1 up to 16 rows (the tensor-map form: 1)");
  });
}

}  // namespace

void prepare_warp_splitk(int token_tiles, int row_tiles, bool tensor_map) {
  with_kernel(token_tiles, row_tiles, tensor_map, [&](auto kernel) {
    TPD_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  warp_smem_bytes(token_tiles, row_tiles, tensor_map)));
  });
}

void launch_warp_splitk(const WarpSplitKParams& p, const GemmTactic& t, bool pdl, cudaStream_t stream,
                        const CUtensorMap* w_map) {
  if (t.tensor_map && w_map == nullptr) throw InvalidArgument("warp split-K: the tensor-map form needs the weight's map");
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(t.split), static_cast<unsigned>(t.blocks));
  s.block = dim3(warp_splitk::kThreads);
  s.smem = static_cast<std::size_t>(warp_smem_bytes(t.token_tiles, t.row_tiles, t.tensor_map));
  s.cluster = t.split;
  s.pdl = pdl;
  const CUtensorMap map = w_map ? *w_map : CUtensorMap{};
  with_kernel(t.token_tiles, t.row_tiles, t.tensor_map, [&](auto kernel) { launch_kernel(kernel, s, stream, p, map); });
}

}  // namespace tpdecode
