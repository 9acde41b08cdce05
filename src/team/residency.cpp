#include <fmt/format.h>

#include <algorithm>

#include "tpdecode/error.hpp"
#include "tpdecode/team.hpp"

namespace tpdecode {

int resident_ctas(const void* kernel, int block, std::size_t smem, int cluster, int device) {
  int sms = 0;
  TPD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (cluster <= 1) {
    int per_sm = 0;
    TPD_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, smem));
    return per_sm * sms;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(cluster), 1, 1);
  config.blockDim = dim3(static_cast<unsigned>(block), 1, 1);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cluster);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  int clusters = 0;
  TPD_CUDA(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
  return clusters * cluster;
}

int coresident_ctas_per_rank(const RankContext& ctx, const void* kernel, int block, std::size_t smem, int cluster) {
  const int per_rank = resident_ctas(kernel, block, smem, cluster, ctx.device) / std::max(1, ctx.ranks_on_device);
  if (cluster > 1 && ctx.ranks_on_device > 1) return per_rank / (2 * cluster) * cluster;
  return per_rank;
}

void require_coresident(const RankContext& ctx, const char* op, const void* kernel, long grid_ctas,
                        int block, std::size_t smem, int cluster) {
  const int budget = coresident_ctas_per_rank(ctx, kernel, block, smem, cluster);
  if (grid_ctas <= budget) return;
  throw CapacityError(fmt::format(
      "{}: {} rank(s) on this GPU x {} CTAs cannot all be resident at once (each rank may hold {} of these "
      "CTAs); spin-waiting CTAs would wait for CTAs that never start. Use fewer rows per call or a smaller "
      "team on one GPU",
      op, ctx.ranks_on_device, grid_ctas, budget));
}

}  // namespace tpdecode
