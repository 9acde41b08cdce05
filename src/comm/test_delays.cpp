#include "comm/test_delays.hpp"

#include <cuda_runtime_api.h>

#include "core/check.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {

bool test_delays_built() {
#if defined(TPDECODE_TEST_DELAYS)
  return true;
#else
  return false;
#endif
}

void set_test_delays(int device, const TestDelays& delays) {
#if defined(TPDECODE_TEST_DELAYS)
  check(delays.one_in == 0 || delays.max_ns > 0, "set_test_delays: a delay needs max_ns > 0");
  int current = 0;
  TPD_CUDA(cudaGetDevice(&current));
  TPD_CUDA(cudaSetDevice(device));
  const cudaError_t copied = cudaMemcpy(test_delays_address(), &delays, sizeof delays, cudaMemcpyHostToDevice);
  TPD_CUDA(cudaSetDevice(current));
  TPD_CUDA(copied);
#else
  (void)device;
  (void)delays;
  throw Unavailable("in-kernel test delays: tpdecode was built without TPDECODE_TEST_DELAYS");
#endif
}

}  // namespace tpdecode
