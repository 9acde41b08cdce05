#include <cuda_runtime.h>

#include "bench_timing.hpp"
#include "tpdecode/device.cuh"
#include "tpdecode/launch.cuh"
#include "read_ceiling.hpp"
#include "tpdecode/device_buffer.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/random_fill.hpp"

namespace tpdecode::bench {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;     // independent 16-byte loads in flight per thread
constexpr int kPartials = 64;  // [64] unsigned: one per block % 64 keeps the loads alive

// Sums every 32-bit word (as integers). With PDL it lets the next kernel launch at
// entry and waits for the previous one only before its one write.
template <bool kPdl>
__global__ void __launch_bounds__(kThreads) streaming_sum_kernel(const uint4* p, int64_t words, unsigned* partial) {
  if constexpr (kPdl) dev::pdl_launch_dependents();
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
  if constexpr (kPdl) dev::pdl_wait();
  atomicAdd(partial + blockIdx.x % kPartials, s);
}

void enqueue_streaming_sum(const void* buf, int64_t words, unsigned* partial, bool pdl, cudaStream_t stream) {
  int device = 0, sms = 0;
  TPD_CUDA(cudaGetDevice(&device));
  TPD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(sms * 4));
  s.block = dim3(kThreads);
  s.pdl = pdl;
  if (pdl)
    launch_kernel(streaming_sum_kernel<true>, s, stream, static_cast<const uint4*>(buf), words, partial);
  else
    launch_kernel(streaming_sum_kernel<false>, s, stream, static_cast<const uint4*>(buf), words, partial);
}

}  // namespace

double time_streaming_read(const void* base, std::size_t bytes, int copies, int calls, int replays,
                           cudaStream_t stream) {
  const DeviceBuffer partial(kPartials * sizeof(unsigned));
  return time_graph(
             stream,
             [&](cudaStream_t s, int c) {
               enqueue_streaming_sum(static_cast<const char*>(base) + bytes * static_cast<std::size_t>(c % copies),
                                     static_cast<int64_t>(bytes / 16), partial.as<unsigned>(), false, s);
             },
             calls, replays)
      .median_us;
}

double time_read_chain(const std::vector<ReadBuffer>& buffers, bool pdl, int replays, cudaStream_t stream) {
  const DeviceBuffer partial(kPartials * sizeof(unsigned));
  return time_graph(
             stream,
             [&](cudaStream_t s, int) {
               for (const ReadBuffer& b : buffers)
                 enqueue_streaming_sum(b.data, static_cast<int64_t>(b.bytes / 16), partial.as<unsigned>(), pdl, s);
             },
             1, replays)
      .median_us;
}

ReadCeiling measure_read_ceiling(std::size_t bytes, int replays, cudaStream_t stream) {
  const int64_t words = static_cast<int64_t>(bytes / 16);
  const DeviceBuffer buf(static_cast<std::size_t>(words) * 16);  // [words] x 16 B
  fill_uniform_bf16(buf.get(), words * 8, 1, 1.0f, stream);
  ReadCeiling r;
  r.bytes = static_cast<std::size_t>(words) * 16;
  r.median_us = time_streaming_read(buf.get(), r.bytes, 1, 1, replays, stream);
  r.tb_per_s = static_cast<double>(r.bytes) / (r.median_us * 1e6);
  return r;
}

}  // namespace tpdecode::bench
