// How many clusters of C CTAs of the GEMM program's size (one CTA per SM: 384
// threads, 227 KB of shared memory) one GPU holds at once: the first fact a design
// with split-K inside clusters (partials through distributed shared memory) needs,
// since a persistent kernel's CTAs wait on each other and must all be resident.
// For C = 1, 2, 4, 8 (and 16, non-portable): the library's resident_ctas (what the
// teams size their grids by: cudaOccupancyMaxActiveClusters), then a launch of that
// many CTAs, each counting itself in and waiting (bounded) until all have: "all
// resident" or how many arrived. Built and run by `scripts/device.sh
// cluster-residency`; docs/performance.md ("Chains") has what it measured.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <exception>

#include "core/launch.cuh"
#include "team/rank_context.hpp"

constexpr int kThreads = 384;
constexpr int kSmem = 227 * 1024;

__global__ void count_in(unsigned* arrived, unsigned expected, unsigned* all_seen) {
  extern __shared__ uint8_t smem[];
  smem[threadIdx.x] = 0;  // the shared memory is really asked for
  if (threadIdx.x != 0) return;
  atomicAdd(arrived, 1u);
  long long start = clock64();
  while (atomicAdd(arrived, 0u) < expected)
    if (clock64() - start > 2000000000LL) return;  // ~1 s: not all resident
  atomicAdd(all_seen, 1u);
}

int main() {
  using namespace tpdecode;
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaFuncSetAttribute(count_in, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  cudaFuncSetAttribute(count_in, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  unsigned* counters;
  cudaMalloc(&counters, 2 * sizeof(unsigned));
  std::printf("%d SMs; CTAs of %d threads and %d KB of shared memory\n", sms, kThreads, kSmem / 1024);
  for (int c : {1, 2, 4, 8, 16}) {
    try {
      // The library's count (what the teams size their grids by), then a launch of it.
      const int ctas = resident_ctas(reinterpret_cast<const void*>(count_in), kThreads, kSmem, c, 0);
      cudaMemset(counters, 0, 2 * sizeof(unsigned));
      launch_kernel(count_in, LaunchShape{dim3(static_cast<unsigned>(ctas)), dim3(kThreads), kSmem, c}, nullptr,
                    counters, static_cast<unsigned>(ctas), counters + 1);
      TPD_CUDA(cudaDeviceSynchronize());
      unsigned got[2] = {0, 0};
      cudaMemcpy(got, counters, sizeof(got), cudaMemcpyDeviceToHost);
      std::printf("clusters of %2d: %3d at once = %3d CTAs of %d SMs (%d idle); %u of %d saw all resident\n", c,
                  ctas / c, ctas, sms, sms - ctas, got[1], ctas);
    } catch (const std::exception& e) {
      std::printf("clusters of %2d: none (%s)\n", c, e.what());
    }
  }
  return 0;
}
