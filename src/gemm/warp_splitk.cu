#include "core/launch.cuh"
#include "gemm/warp_splitk.cuh"

namespace tpdecode {
namespace {

// Calls f with the kernel instantiated for (token tiles, stages).
template <class F>
void with_kernel(int tiles, int stages, F&& f) {
  auto by_stages = [&](auto tiles_c) {
    constexpr int kT = decltype(tiles_c)::value;
    switch (stages) {
      case 4: return f(warp_splitk::warp_splitk_kernel<kT, 4>);
      case 6: return f(warp_splitk::warp_splitk_kernel<kT, 6>);
      case 8: return f(warp_splitk::warp_splitk_kernel<kT, 8>);
      default: throw InvalidArgument("warp split-K: ring stages must be 4, 6 or 8");
    }
  };
  switch (tiles) {
    case 1: return by_stages(std::integral_constant<int, 1>{});
    case 2: return by_stages(std::integral_constant<int, 2>{});
    case 4: return by_stages(std::integral_constant<int, 4>{});
    default: throw InvalidArgument("warp split-K: token tiles must be 1, 2 or 4");
  }
}

int resident_clusters(int tiles, int stages, int split, int smem_bytes) {
  int clusters = 0;
  with_kernel(tiles, stages, [&](auto kernel) {
    TPD_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kWarpSmemLimit));
    if (split == 1) {  // no cluster: blocks per SM times SMs
      int device = 0, sms = 0, per_sm = 0;
      TPD_CUDA(cudaGetDevice(&device));
      TPD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      TPD_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, warp_splitk::kThreads, smem_bytes));
      clusters = sms * per_sm;
      return;
    }
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(split), 1);
    config.blockDim = dim3(warp_splitk::kThreads);
    config.dynamicSmemBytes = static_cast<std::size_t>(smem_bytes);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(split);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    TPD_CUDA(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
  });
  return clusters;
}

}  // namespace

ClusterResidency warp_splitk_residency() { return resident_clusters; }

void launch_warp_splitk(const WarpSplitKParams& p, const GemmTactic& t, bool pdl, cudaStream_t stream) {
  require(t.runnable(), "warp split-K: launched with a tactic that does not run");
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(t.split), static_cast<unsigned>(t.clusters));
  s.block = dim3(warp_splitk::kThreads);
  s.smem = static_cast<std::size_t>(t.smem_bytes);
  s.cluster = t.split;
  s.pdl = pdl;
  with_kernel(t.token_tiles, t.stages, [&](auto kernel) { launch_kernel(kernel, s, stream, p); });
}

}  // namespace tpdecode
