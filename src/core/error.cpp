#include "tpdecode/error.hpp"

#include <fmt/format.h>

namespace tpdecode {

namespace {

// Why a hint: these codes mean a call that may not run under stream capture ran
// while one was in progress, most often a tpdecode object built (or a row count
// prepared) inside a graph capture.
bool capture_error(cudaError_t code) {
  switch (code) {
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorStreamCaptureWrongThread:
    case cudaErrorCapturedEvent: return true;
    default: return false;
  }
}

}  // namespace

void throw_cuda(cudaError_t code, const char* expr, const char* file, int line) {
  throw CudaError(code, fmt::format("CUDA error {} ({}) in {} at {}:{}{}", cudaGetErrorName(code),
                                    cudaGetErrorString(code), expr, file, line,
                                    capture_error(code) ? " (a stream capture was in progress: build tpdecode objects "
                                                          "and prepare their row counts before capturing)"
                                                        : ""));
}

}  // namespace tpdecode
