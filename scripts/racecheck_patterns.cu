// Racecheck's calibration: the synchronisation forms tpdecode's kernels use, each in a
// minimal kernel that is correct by the PTX memory model, so that a hazard racecheck
// reports in a real kernel can be matched to a form racecheck does or does not follow.
// Built and run by `scripts/device.sh race-patterns` (compute-sanitizer --tool
// racecheck); docs/performance.md ("Known issues") has what it reported.
#include <cooperative_groups.h>

#include <cstdio>

#include "core/device.cuh"
#include "gemm/wgmma_ops.cuh"

namespace cg = cooperative_groups;
using namespace tpdecode;

// The warp engine's two-tile CTA: two groups of 64 threads, each looping on its own
// named barrier (group 1 `short_by` rounds fewer), then every thread stores its
// partials, __syncthreads, and the groups' partials are summed across threads.
__global__ void named_barriers_then_syncthreads(float* out, int short_by) {
  __shared__ float partials[2][512];
  __shared__ float ring[2][64];
  const int tid = static_cast<int>(threadIdx.x), group = tid / 64;
  float acc = 0;
  for (int round = 0; round < 4 - (group == 1 ? short_by : 0); ++round) {
    ring[group][tid % 64] = static_cast<float>(round + tid);
    dev::named_barrier_sync(1 + group, 64);
    acc += ring[group][(tid + 1) % 64];
    dev::named_barrier_sync(1 + group, 64);
  }
  for (int i = 0; i < 8; ++i) partials[group][(tid % 64) * 8 + i] = acc + static_cast<float>(i);
  __syncthreads();
  for (int e = tid; e < 512; e += 128) partials[0][e] += partials[1][e];
  __syncthreads();
  out[tid] = partials[0][(3 * tid) % 512];
}

// The program's finisher -> consumers hand-over: 4 warps store, and each warp's lane
// 0 arrives after __syncwarp (kPerWarp), or every thread arrives; 4 warps wait and
// read.
template <bool kPerWarp>
__global__ void mbarrier_handoff(float* out) {
  __shared__ float data[128];
  __shared__ __align__(8) uint64_t full;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) dev::mbar_init(&full, kPerWarp ? 4 : 128);
  __syncthreads();
  if (tid >= 128) {
    data[tid - 128] = 0.5f * static_cast<float>(tid);
    if (kPerWarp) {
      __syncwarp();
      if (tid % 32 == 0) dev::mbar_arrive(&full);
    } else {
      dev::mbar_arrive(&full);
    }
    return;
  }
  dev::mbar_wait(&full, 0);
  out[tid] = data[(tid + 37) % 128];
}

// The wgmma engine's split-K partials in a cluster of 2: every thread stores, then
// (kPerCta) a named barrier and thread 0 arrives, with release at cluster scope, on
// both CTAs' `ready`, or every thread arrives; all read both CTAs' partials through
// distributed shared memory, then `freed` the same way; a CTA leaves once its
// `freed` completed (its shared memory outlives the peer's reads).
template <bool kPerCta>
__global__ void __cluster_dims__(2, 1, 1) cluster_partials(float* out) {
  __shared__ float mine[128];
  __shared__ __align__(8) uint64_t ready, freed;
  const cg::cluster_group cluster = cg::this_cluster();
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    dev::mbar_init(&ready, kPerCta ? 2 : 256);
    dev::mbar_init(&freed, kPerCta ? 2 : 256);
    dev::mbar_init_fence();
  }
  cluster.sync();
  auto arrive_on_both = [&](uint64_t* bar) {
    if (kPerCta) {
      dev::named_barrier_sync(1, 128);
      if (tid != 0) return;
    }
    for (unsigned r = 0; r < 2; ++r) dev::mbar_arrive_remote(cluster.map_shared_rank(bar, r));
  };
  mine[tid] = static_cast<float>(tid) + 1000.0f * static_cast<float>(cluster.block_rank());
  arrive_on_both(&ready);
  dev::mbar_wait_cluster(&ready, 0);
  const float v = cluster.map_shared_rank(mine, 0u)[(tid + 5) % 128] + cluster.map_shared_rank(mine, 1u)[(tid + 9) % 128];
  arrive_on_both(&freed);
  out[cluster.block_rank() * 128 + tid] = v;
  dev::mbar_wait_cluster(&freed, 0);
}

int main() {
  float* out = nullptr;
  if (cudaMalloc(&out, 256 * sizeof(float)) != cudaSuccess) return 1;
  auto report = [](const char* what) {
    const cudaError_t e = cudaDeviceSynchronize();
    std::printf("%s: %s\n", what, cudaGetErrorString(e));
    return e == cudaSuccess;
  };
  bool ok = true;
  for (int short_by : {0, 1, 4}) {
    named_barriers_then_syncthreads<<<1, 128>>>(out, short_by);
    ok &= report(short_by == 0 ? "named barriers, even rounds" : "named barriers, uneven rounds");
  }
  mbarrier_handoff<true><<<1, 256>>>(out);
  ok &= report("mbarrier hand-over, one arrival per warp");
  mbarrier_handoff<false><<<1, 256>>>(out);
  ok &= report("mbarrier hand-over, one arrival per thread");
  cluster_partials<true><<<2, 128>>>(out);
  ok &= report("cluster partials, one arrival per CTA");
  cluster_partials<false><<<2, 128>>>(out);
  ok &= report("cluster partials, one arrival per thread");
  return ok ? 0 : 1;
}
