// How long a flag takes from one SM to another while the GPU streams weights, the
// question behind GemmProgram's cap on the weight bytes in flight (kInFlightBytes,
// src/program/program_kernel.cu). One CTA per SM, clusters of 2; every CTA (or every
// CTA but the two that trade the flag) streams its slice of a 2 GB buffer through a
// ring of `stages` bulk copies of 32 KB, all in flight; CTA 0 and a peer trade a
// counter 2,000 times:
//   global: relaxed stores and polls in global memory, the peer the last CTA;
//   gnear:  the same, the peer CTA 1 (CTA 0's cluster);
//   dsmem:  a store into the peer's shared memory, polled there (CTA 1).
// Prints the one-way time (half a round trip), the SMs, and the stream's rate.
// Built and run by `scripts/device.sh flag-latency`; docs/performance.md
// ("Chains") has what it measured.
#include <cooperative_groups.h>

#include <cstdint>
#include <cstdio>

#include "core/device.cuh"

namespace cg = cooperative_groups;
using namespace tpdecode;

constexpr int kMaxStages = 6;
constexpr uint32_t kStageBytes = 32768;
constexpr int kTrades = 2000;

enum Path { kGlobal, kDsmem, kGlobalNear };
enum Load { kIdle, kEverySm, kOtherSms };

struct Args {
  const uint8_t* buffer;
  int64_t slice;  // bytes a CTA streams, again and again
  Load load;
  Path path;
  int stages;
  uint32_t* flags;  // [0]: CTA 0's, [32]: the peer's (another 128-byte line)
  uint32_t* stop;
  unsigned long long* result;  // ns of the trades, CTA 0's SM, the peer's SM
  unsigned long long* streamed;
};

__device__ uint32_t load_relaxed(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ void store_relaxed(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ uint32_t load_own_shared(uint32_t address) {
  uint32_t v;
  asm volatile("ld.relaxed.cluster.shared::cta.b32 %0, [%1];" : "=r"(v) : "r"(address) : "memory");
  return v;
}
__device__ void store_peer_shared(uint32_t address, uint32_t v) {
  asm volatile("st.relaxed.cluster.shared::cluster.b32 [%0], %1;" ::"r"(address), "r"(v) : "memory");
}

// Thread 0: the ring of bulk copies until CTA 0 raises `stop`.
__device__ void stream(const Args& a, uint8_t* smem, uint64_t* full) {
  const uint8_t* base = a.buffer + blockIdx.x * a.slice;
  const uint64_t policy = dev::evict_first_policy();
  int64_t offset = 0;
  auto issue = [&](int s) {
    if (offset + kStageBytes > a.slice) offset = 0;
    dev::mbar_arrive_expect_tx(full + s, kStageBytes);
    dev::bulk_copy_to_shared(smem + s * kStageBytes, base + offset, kStageBytes, full + s, policy);
    offset += kStageBytes;
  };
  for (int s = 0; s < a.stages; ++s) issue(s);
  uint64_t landed = 0;
  uint32_t parity = 0;
  int s = 0;
  auto next = [&] {
    if (++s == a.stages) s = 0, parity ^= 1;
  };
  for (;;) {
    dev::mbar_wait(full + s, parity);
    ++landed;
    if (landed % 16 == 0 && load_relaxed(a.stop) != 0) break;
    issue(s);
    next();
  }
  next();
  for (int i = 1; i < a.stages; ++i, next()) dev::mbar_wait(full + s, parity);  // the copies still in flight
  atomicAdd(a.streamed, static_cast<unsigned long long>(landed) * kStageBytes);
}

// Thread 32 of CTA 0 and of its peer: the trades, after 200 us for the streams to
// reach their rate.
__device__ void trade(const Args& a, uint32_t* flag) {
  const unsigned peer = a.path == kGlobal ? gridDim.x - 1 : 1;
  const bool first = blockIdx.x == 0;
  if (!first && blockIdx.x != peer) return;
  uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  a.result[first ? 1 : 2] = sm;
  const uint32_t own = static_cast<uint32_t>(__cvta_generic_to_shared(flag));
  uint32_t remote = 0;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(own), "r"(first ? 1u : 0u));
  uint32_t* mine = a.flags + (first ? 0 : 32);
  uint32_t* theirs = a.flags + (first ? 32 : 0);
  const uint64_t warm = dev::global_timer_ns();
  while (dev::global_timer_ns() - warm < 200000) {
  }
  auto send = [&](uint32_t i) { a.path == kDsmem ? store_peer_shared(remote, i) : store_relaxed(theirs, i); };
  auto await = [&](uint32_t i) {
    if (a.path == kDsmem)
      while (load_own_shared(own) != i) {
      }
    else
      while (load_relaxed(mine) != i) {
      }
  };
  const uint64_t t0 = dev::global_timer_ns();
  for (uint32_t i = 1; i <= kTrades; ++i) {
    if (first) {
      send(i);
      await(i);
    } else {
      await(i);
      send(i);
    }
  }
  if (first) {
    a.result[0] = dev::global_timer_ns() - t0;
    store_relaxed(a.stop, 1);
  }
}

__global__ void __cluster_dims__(2, 1, 1) flag_latency(Args a) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t full[kMaxStages];
  __shared__ uint32_t flag;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    for (int s = 0; s < a.stages; ++s) dev::mbar_init(full + s, 1);
    flag = 0;
    dev::mbar_init_fence();
  }
  __syncthreads();
  cg::this_cluster().sync();  // the peer's flag initialised before any remote store
  const bool trader = blockIdx.x == 0 || blockIdx.x == 1 || blockIdx.x == gridDim.x - 1;
  if (tid == 0 && a.load != kIdle && !(a.load == kOtherSms && trader)) stream(a, smem, full);
  if (tid == 32) trade(a, &flag);
  __syncthreads();
  cg::this_cluster().sync();  // no CTA leaves while its peer may still store into it
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int grid = sms / 2 * 2;
  const int64_t total = int64_t{2} << 30;
  uint8_t* buffer = nullptr;
  uint32_t* flags = nullptr;
  unsigned long long *result = nullptr, *streamed = nullptr;
  if (cudaMalloc(&buffer, total) != cudaSuccess || cudaMalloc(&flags, 4096) != cudaSuccess ||
      cudaMallocManaged(&result, 64) != cudaSuccess || cudaMallocManaged(&streamed, 8) != cudaSuccess) {
    std::printf("flag_latency: allocation failed\n");
    return 1;
  }
  cudaMemset(buffer, 1, total);
  const int smem = kMaxStages * kStageBytes;
  cudaFuncSetAttribute(flag_latency, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const char* paths[] = {"global", "dsmem", "gnear"};
  const char* loads[] = {"idle", "every SM", "other SMs"};
  std::printf("stages  load       path    SMs        one-way ns   stream TB/s\n");
  for (Load load : {kIdle, kEverySm, kOtherSms})
    for (int stages = load == kIdle ? kMaxStages : 1; stages <= kMaxStages; ++stages) {
      if (stages == 5) continue;
      for (Path path : {kGlobal, kGlobalNear, kDsmem}) {
        cudaMemset(flags, 0, 4096);
        *streamed = 0;
        const Args a{buffer, total / grid / kStageBytes * kStageBytes, load, path, stages, flags, flags + 512,
                     result, streamed};
        cudaEvent_t start, stop;
        cudaEventCreate(&start);
        cudaEventCreate(&stop);
        cudaEventRecord(start);
        flag_latency<<<grid, 64, smem>>>(a);
        cudaEventRecord(stop);
        if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
          std::printf("flag_latency: %s\n", cudaGetErrorString(e));
          return 1;
        }
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        std::printf("%6d  %-9s  %-6s  %3llu %3llu  %11.0f   %11.2f\n", load == kIdle ? 0 : stages, loads[load],
                    paths[path], result[1], result[2], result[0] / (2.0 * kTrades), *streamed / (ms * 1e9));
      }
    }
  return 0;
}
