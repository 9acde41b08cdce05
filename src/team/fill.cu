#include "team/fill.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

__global__ void fill_words_kernel(uint32_t* p, std::size_t words, uint32_t value) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < words;
       i += std::size_t{gridDim.x} * blockDim.x)
    p[i] = value;
}

}  // namespace

void fill_words(void* p, std::size_t words, uint32_t value, cudaStream_t stream) {
  if (words == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>((words + 255) / 256, 4096));
  fill_words_kernel<<<blocks, 256, 0, stream>>>(static_cast<uint32_t*>(p), words, value);
  TPD_CUDA(cudaGetLastError());
}

}  // namespace tpdecode
