#include <cuda_runtime.h>

#include <memory>

#include "bench_timing.hpp"
#include "read_ceiling.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/random_fill.hpp"

namespace tpdecode::bench {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // independent 16-byte loads in flight per thread

// Sums every 32-bit word (as integers); one partial per block keeps the loads alive.
__global__ void __launch_bounds__(kThreads) streaming_sum_kernel(const uint4* p, int64_t words, unsigned* partial) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  unsigned s = 0;
  int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < words; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) s += v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < words; i += stride) {
    const uint4 v = __ldcs(p + i);
    s += v.x ^ v.y ^ v.z ^ v.w;
  }
  atomicAdd(partial + blockIdx.x % 64, s);
}

void enqueue_streaming_sum(const void* buf, int64_t words, unsigned* partial, cudaStream_t stream) {
  int device = 0, sms = 0;
  TPD_CUDA(cudaGetDevice(&device));
  TPD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  streaming_sum_kernel<<<static_cast<unsigned>(sms * 4), kThreads, 0, stream>>>(static_cast<const uint4*>(buf), words,
                                                                               partial);
  TPD_CUDA(cudaGetLastError());
}

}  // namespace

double time_streaming_read(const void* base, std::size_t bytes, int copies, int calls, int replays,
                           cudaStream_t stream) {
  void* partial = nullptr;  // [64] unsigned
  TPD_CUDA(cudaMalloc(&partial, 64 * sizeof(unsigned)));
  const std::unique_ptr<void, decltype(&cudaFree)> partial_guard(partial, &cudaFree);
  return time_graph(
             stream,
             [&](cudaStream_t s, int c) {
               enqueue_streaming_sum(static_cast<const char*>(base) + bytes * static_cast<std::size_t>(c % copies),
                                     static_cast<int64_t>(bytes / 16), static_cast<unsigned*>(partial), s);
             },
             calls, replays)
      .median_us;
}

ReadCeiling measure_read_ceiling(std::size_t bytes, int replays, cudaStream_t stream) {
  const int64_t words = static_cast<int64_t>(bytes / 16);
  void* buf = nullptr;  // [words] x 16 B
  TPD_CUDA(cudaMalloc(&buf, static_cast<std::size_t>(words) * 16));
  const std::unique_ptr<void, decltype(&cudaFree)> buf_guard(buf, &cudaFree);
  fill_uniform_bf16(buf, words * 8, 1, 1.0f, stream);
  ReadCeiling r;
  r.bytes = static_cast<std::size_t>(words) * 16;
  r.median_us = time_streaming_read(buf, r.bytes, 1, 1, replays, stream);
  r.tb_per_s = static_cast<double>(r.bytes) / (r.median_us * 1e6);
  return r;
}

}  // namespace tpdecode::bench
