// Fresh random BF16 data on the device (synthetic weights and activations for
// tests and benchmarks): no host generation, gigabytes in milliseconds.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tpdecode {

// p[i] = bf16(scale * u_i), u_i uniform in [-1, 1) from a hash of (i, seed).
// Never all zeros; the same (count, seed) gives the same bits.
void fill_uniform_bf16(void* p, int64_t count, uint64_t seed, float scale, cudaStream_t stream);

}  // namespace tpdecode
