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

}  // namespace tpdecode::bench
