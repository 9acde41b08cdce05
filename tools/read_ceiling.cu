#include <cuda_runtime.h>

#include <algorithm>

#include "core/device.cuh"
#include "core/graph_timing.hpp"
#include "core/launch.cuh"
#include "core/random_fill.hpp"
#include "read_ceiling.hpp"
#include "tpdecode/device_buffer.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::bench {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // independent 16-byte loads in flight per thread, the tail's too

// Two ways to stream 16 bytes, both timed (the ceiling is the faster): through the
// non-coherent path, allocating nothing in L1 and asking L2 for the whole 256-byte
// sector group; or an evict-first load (ld.global.cs).
enum class Load { kNonCoherent256, kEvictFirst };
template <Load kLoad>
__device__ __forceinline__ uint4 load_streaming(const uint4* p) {
  if constexpr (kLoad == Load::kEvictFirst) return __ldcs(p);
  return dev::load_once16(p);
}

// Folds every 32-bit word. With PDL it lets the next kernel launch at entry and
// waits for the previous one only before its write. Why the predicated tail: a
// plain remainder loop keeps one load in flight per thread, and in a buffer of a
// few MB most of the words are in the remainder (the first version measured a
// chain of such buffers at half the ceiling for that reason). Why the write is
// conditional: the folded value must look used, and a store per CTA (or atomics
// into a few words) would be part of what is timed.
template <bool kPdl, Load kLoad>
__global__ void __launch_bounds__(kThreads) streaming_sum_kernel(const uint4* p, int64_t words, unsigned* sink) {
  if constexpr (kPdl) dev::pdl_launch_dependents();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  unsigned s = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < words; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = i + u * stride < words ? load_streaming<kLoad>(p + i + u * stride) : uint4{};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) s += v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if constexpr (kPdl) dev::pdl_wait();
  if (s == 0x9e3779b9u) sink[blockIdx.x % 64] = s;
}

// One way to read: CTAs per SM and the load.
struct ReadShape {
  int ctas_per_sm;
  Load load;
};

void enqueue_streaming_sum(const void* buf, int64_t words, unsigned* sink, ReadShape shape, bool pdl,
                           cudaStream_t stream) {
  int device = 0, sms = 0;
  TPD_CUDA(cudaGetDevice(&device));
  TPD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(sms * shape.ctas_per_sm));
  s.block = dim3(kThreads);
  s.pdl = pdl;
  using Kernel = void (*)(const uint4*, int64_t, unsigned*);
  constexpr Kernel kernels[2][2] = {
      {streaming_sum_kernel<false, Load::kNonCoherent256>, streaming_sum_kernel<false, Load::kEvictFirst>},
      {streaming_sum_kernel<true, Load::kNonCoherent256>, streaming_sum_kernel<true, Load::kEvictFirst>}};
  launch_kernel(kernels[pdl ? 1 : 0][shape.load == Load::kEvictFirst ? 1 : 0], s, stream,
                static_cast<const uint4*>(buf), words, sink);
}

// The fastest over 1, 2 and 4 CTAs per SM and both loads (a ceiling is the best
// the hardware does).
template <class Time>
double best_over_read_shapes(Time time) {
  double best = 1e30;
  for (Load load : {Load::kNonCoherent256, Load::kEvictFirst})
    for (int ctas_per_sm : {1, 2, 4}) best = std::min(best, time(ReadShape{ctas_per_sm, load}));
  return best;
}

}  // namespace

double time_streaming_read(const void* base, std::size_t bytes, int copies, int calls, int replays,
                           cudaStream_t stream) {
  const DeviceBuffer sink(64 * sizeof(unsigned));
  return best_over_read_shapes([&](ReadShape shape) {
    return time_graph(
               stream,
               [&](cudaStream_t s, int c) {
                 enqueue_streaming_sum(static_cast<const char*>(base) + bytes * static_cast<std::size_t>(c % copies),
                                       static_cast<int64_t>(bytes / 16), sink.as<unsigned>(), shape, false, s);
               },
               calls, replays)
        .median_us;
  });
}

double time_read_chain(const std::vector<ReadBuffer>& buffers, bool pdl, int replays, cudaStream_t stream) {
  const DeviceBuffer sink(64 * sizeof(unsigned));
  return best_over_read_shapes([&](ReadShape shape) {
    return time_graph(
               stream,
               [&](cudaStream_t s, int) {
                 for (const ReadBuffer& b : buffers)
                   enqueue_streaming_sum(b.data, static_cast<int64_t>(b.bytes / 16), sink.as<unsigned>(), shape, pdl,
                                         s);
               },
               1, replays)
        .median_us;
  });
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
