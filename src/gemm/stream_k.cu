#include "tpdecode/launch.cuh"
#include "gemm/token_tiles.hpp"
#include "gemm/stream_k.cuh"

namespace tpdecode {

int64_t stream_k_partial_floats(int ctas) { return int64_t{ctas} * 2 * stream_k::kPartialFloats; }

void prepare_stream_k() {
  for (int tiles : {1, 2, 4})
    with_token_tiles(tiles, [](auto t) {
      auto* kernel = stream_k::stream_k_kernel<decltype(t)::value>;
      // Why the largest limit for every instance: the variants choose their own ring
      // depth; the launch passes the size it uses.
      TPD_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemPerCtaMax));
      // Why: two CTAs of 113 KB (variant 3, or one beside the next kernel's) need the
      // whole 228 KB carve-out.
      TPD_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    cudaSharedmemCarveoutMaxShared));
    });
}

void launch_stream_k(const StreamKParams& p, const StreamTactic& t, bool pdl, cudaStream_t stream) {
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(t.ctas));
  s.block = dim3(stream_k::kThreads);
  s.smem = static_cast<std::size_t>(t.smem_bytes);
  s.pdl = pdl;
  with_token_tiles(t.token_tiles,
                   [&](auto tiles) { launch_kernel(stream_k::stream_k_kernel<decltype(tiles)::value>, s, stream, p); });
}

}  // namespace tpdecode
