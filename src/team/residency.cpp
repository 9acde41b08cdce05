#include <algorithm>

#include "team/rank_context.hpp"
#include "tpdecode/error.hpp"

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

}  // namespace tpdecode
