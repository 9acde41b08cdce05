#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tpdecode {

// Sets `words` 32-bit words at `p` (device memory) to `value` on `stream`.
void fill_words(void* p, std::size_t words, uint32_t value, cudaStream_t stream);

}  // namespace tpdecode
