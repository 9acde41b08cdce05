// The counter-based hash behind every synthetic weight and input of the drafter:
// element (row, col) of tensor `tensor` is a pure function of (seed, tensor, row,
// col) in *global* coordinates, so each rank generates exactly its shard on the
// device and the CPU reference regenerates any element on the host.
// (No fmt here: included by .cu files.)
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TPD_HOST_DEVICE __host__ __device__
#else
#define TPD_HOST_DEVICE
#endif

namespace tpdecode::drafter {

// splitmix64's finaliser.
TPD_HOST_DEVICE inline uint64_t mix64(uint64_t h) {
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  return h ^ (h >> 31);
}

TPD_HOST_DEVICE inline uint64_t element_hash(uint64_t seed, uint32_t tensor, uint64_t row, uint64_t col) {
  uint64_t h = mix64(seed * 0x9E3779B97F4A7C15ull + tensor);
  h = mix64(h ^ (row * 0xD1B54A32D192ED03ull));
  return mix64(h ^ (col * 0x8CB92BA72F3D8DD7ull));
}

// Uniform in [-1, 1) with 24 bits: exact in FP32 on host and device alike.
TPD_HOST_DEVICE inline float element_uniform(uint64_t seed, uint32_t tensor, uint64_t row, uint64_t col) {
  return static_cast<float>(element_hash(seed, tensor, row, col) >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

}  // namespace tpdecode::drafter
