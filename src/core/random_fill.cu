#include <cuda_bf16.h>

#include <algorithm>

#include "core/hash.hpp"
#include "core/random_fill.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

__global__ void fill_uniform_bf16_kernel(__nv_bfloat16* p, int64_t count, uint64_t seed, float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count; i += stride) {
    p[i] = __float2bfloat16_rn(scale * hash::uniform24(hash::keyed(seed, static_cast<uint64_t>(i))));
  }
}

}  // namespace

void fill_uniform_bf16(void* p, int64_t count, uint64_t seed, float scale, cudaStream_t stream) {
  require(p != nullptr || count == 0, "fill_uniform_bf16: null pointer");
  if (count == 0) return;
  const int64_t blocks = std::min<int64_t>((count + 255) / 256, 4096);
  fill_uniform_bf16_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(p), count,
                                                                              seed, scale);
  TPD_CUDA(cudaGetLastError());
}

}  // namespace tpdecode
