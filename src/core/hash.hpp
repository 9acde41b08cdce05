// A counter-based hash for synthetic data: splitmix64's finaliser and a uniform
// value with 24 bits, exact in FP32, identical on host and device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TPD_HASH_HD __host__ __device__ __forceinline__
#else
#define TPD_HASH_HD inline
#endif

namespace tpdecode::hash {

TPD_HASH_HD uint64_t mix64(uint64_t h) {
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  return h ^ (h >> 31);
}

// Keyed mix of one counter.
TPD_HASH_HD uint64_t keyed(uint64_t seed, uint64_t counter) { return mix64(counter + seed * 0x9E3779B97F4A7C15ull); }

// The top 24 bits of h as a value in [-1, 1).
TPD_HASH_HD float uniform24(uint64_t h) { return static_cast<float>(h >> 40) * (1.0f / 8388608.0f) - 1.0f; }

}  // namespace tpdecode::hash
