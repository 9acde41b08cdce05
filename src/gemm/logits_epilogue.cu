#include "core/launch.cuh"
#include "gemm/logits_epilogue.cuh"

namespace tpdecode {

void launch_logits_epilogue(const LogitsEpilogueParams& p, cudaStream_t stream) {
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>((p.vocab + logits::kThreads - 1) / logits::kThreads), static_cast<unsigned>(p.rows));
  s.block = dim3(logits::kThreads);
  launch_kernel(logits::logits_epilogue_kernel, s, stream, p);
}

}  // namespace tpdecode
