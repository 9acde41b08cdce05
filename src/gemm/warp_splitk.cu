#include "core/launch.cuh"
#include "gemm/token_tiles.hpp"
#include "gemm/warp_splitk.cuh"

namespace tpdecode {

void prepare_warp_splitk(int token_tiles) {
  with_token_tiles(token_tiles, [&](auto tiles) {
    TPD_CUDA(cudaFuncSetAttribute(warp_splitk::warp_splitk_kernel<decltype(tiles)::value>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, warp_smem_bytes(token_tiles)));
  });
}

void launch_warp_splitk(const WarpSplitKParams& p, const GemmTactic& t, bool pdl, cudaStream_t stream) {
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(t.split), static_cast<unsigned>(t.blocks));
  s.block = dim3(warp_splitk::kThreads);
  s.smem = static_cast<std::size_t>(warp_smem_bytes(t.token_tiles));
  s.cluster = t.split;
  s.pdl = pdl;
  with_token_tiles(t.token_tiles, [&](auto tiles) {
    launch_kernel(warp_splitk::warp_splitk_kernel<decltype(tiles)::value>, s, stream, p);
  });
}

}  // namespace tpdecode
