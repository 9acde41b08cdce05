// The HBM read ceiling, measured: a streaming read (sum) over a buffer far larger
// than L2, timed like the benchmarks (graph replay, median).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace tpdecode::bench {

struct ReadCeiling {
  double tb_per_s = 0;
  double median_us = 0;
  std::size_t bytes = 0;
};

// Reads `bytes` (rounded down to 16-byte words) of fresh device memory `replays` times.
ReadCeiling measure_read_ceiling(std::size_t bytes, int replays, cudaStream_t stream);

// The same streaming read over `copies` buffers of `bytes` each (bytes a multiple of
// 16) laid out back to back from `base`, rotated like the GEMM benchmark: a graph
// of `calls` reads, call c reading copy c % copies. Median microseconds per read.
double time_streaming_read(const void* base, std::size_t bytes, int copies, int calls, int replays,
                           cudaStream_t stream);

}  // namespace tpdecode::bench
