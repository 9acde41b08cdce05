// How fast one weight [N, K] bf16 streams into shared memory by each load pattern a
// decode GEMM could use, with no arithmetic: the ceiling of an engine's loads. The
// work is cut like the engines' (64-row tiles x K chunks, every CTA the same number
// of chunks, a ring of stages); the consumers only read each stage once.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tpdecode::lab {

struct LoadPattern {
  std::string name;     // e.g. "cp.async 2 rows x 256 B"
  int stages = 0;       // ring stages
  int cols = 0;         // K columns per stage (per 64-row tile)
  int ctas_per_sm = 0;  // grid = SMs x this
};

struct LoadTiming {
  LoadPattern pattern;
  double us = 0;  // median per pass over the weight
};

// A tensor map of w [n, k] bf16 in boxes of [64 rows, 64 columns], 128-byte swizzle.
CUtensorMap weight_tiles_map(const void* w, int64_t n, int64_t k);

// Every pattern for a weight of n x k (n % 64 == 0, k % 512 == 0), over maps.size()
// weight copies laid out back to back from `base` (maps[c]: copy c's tiles; call c
// of a graph reads copy c % copies), graphs of `calls` passes, `replays` timed
// replays.
std::vector<LoadTiming> time_load_patterns(const void* base, int64_t n, int64_t k,
                                           const std::vector<CUtensorMap>& maps, int calls, int replays, int sms,
                                           cudaStream_t stream);

}  // namespace tpdecode::lab
