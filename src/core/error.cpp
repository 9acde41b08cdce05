#include "tpdecode/error.hpp"

#include <fmt/format.h>

namespace tpdecode {

void throw_cuda(cudaError_t code, const char* expr, const char* file, int line) {
  throw CudaError(code, fmt::format("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(code),
                                    cudaGetErrorString(code), expr, file, line));
}

}  // namespace tpdecode
