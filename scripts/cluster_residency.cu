// How many clusters of C CTAs of the GEMM program's size (one CTA per SM: 384
// threads, 227 KB of shared memory) one GPU holds at once: the first fact a design
// with split-K inside clusters (partials through distributed shared memory) needs,
// since a persistent kernel's CTAs wait on each other and must all be resident.
// For C = 1, 2, 4, 8 (and 16, non-portable): cudaOccupancyMaxActiveClusters, then a
// launch of that many clusters whose CTAs each count themselves in and wait (bounded)
// until all have: "all resident" or how many arrived. Built and run by
// `scripts/device.sh cluster-residency`; docs/performance.md ("Chains") has what it
// measured.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

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
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaFuncSetAttribute(count_in, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  cudaFuncSetAttribute(count_in, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  unsigned* counters;
  cudaMalloc(&counters, 2 * sizeof(unsigned));
  std::printf("%d SMs; CTAs of %d threads and %d KB of shared memory\n", sms, kThreads, kSmem / 1024);
  for (int c : {1, 2, 4, 8, 16}) {
    cudaLaunchConfig_t cfg = {};
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kSmem;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(c);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    cfg.gridDim = dim3(static_cast<unsigned>(c));
    int clusters = 0;
    const cudaError_t q = cudaOccupancyMaxActiveClusters(&clusters, count_in, &cfg);
    if (q != cudaSuccess || clusters == 0) {
      std::printf("clusters of %2d: none (%s)\n", c, cudaGetErrorString(q));
      cudaGetLastError();
      continue;
    }
    cfg.gridDim = dim3(static_cast<unsigned>(clusters * c));
    cudaMemset(counters, 0, 2 * sizeof(unsigned));
    const unsigned expected = static_cast<unsigned>(clusters * c);
    const cudaError_t l = cudaLaunchKernelEx(&cfg, count_in, counters, expected, counters + 1);
    const cudaError_t s = cudaDeviceSynchronize();
    unsigned got[2] = {0, 0};
    cudaMemcpy(got, counters, sizeof(got), cudaMemcpyDeviceToHost);
    std::printf("clusters of %2d: %3d at once = %3d CTAs of %d SMs (%d idle); launch %s, %s; %u of %u saw all resident\n",
                c, clusters, clusters * c, sms, sms - clusters * c, cudaGetErrorString(l), cudaGetErrorString(s), got[1],
                expected);
  }
  return 0;
}
