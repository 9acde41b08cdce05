// The HBM read ceiling, measured: a streaming read (sum) over a buffer far larger
// than L2, timed like the benchmarks (graph replay, median). Every figure here is
// the fastest of 1, 2 and 4 CTAs per SM and of two kinds of streaming load: a
// ceiling is the best the hardware does.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

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

// What the hardware allows for a chain of reads: one streaming read of each buffer
// (bytes a multiple of 16), back to back in one graph, optionally with programmatic
// dependent launch (each read lets the next launch at its entry; only its one write
// waits for the previous). Median microseconds for the whole chain.
struct ReadBuffer {
  const void* data;
  std::size_t bytes;
};
double time_read_chain(const std::vector<ReadBuffer>& buffers, bool pdl, int replays, cudaStream_t stream);

}  // namespace tpdecode::bench
