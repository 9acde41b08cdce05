// Kernel launch with the options tpdecode's kernels use: programmatic dependent
// launch (the kernel may start while the previous one in the stream finishes; it
// must call griddepcontrol.wait before touching that kernel's outputs) and
// thread-block clusters.
#pragma once

#include <cuda_runtime.h>

#include "tpdecode/error.hpp"

namespace tpdecode {

struct LaunchShape {
  dim3 grid;
  dim3 block;
  std::size_t smem = 0;
  int cluster = 1;  // CTAs per cluster along x
  bool pdl = false;
};

template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), const LaunchShape& s, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = s.grid;
  config.blockDim = s.block;
  config.dynamicSmemBytes = s.smem;
  config.stream = stream;
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  if (s.pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (s.cluster > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = static_cast<unsigned>(s.cluster);
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  config.attrs = attrs;
  config.numAttrs = n;
  TPD_CUDA(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace tpdecode
