// Delays inside the one-shot all-reduce kernel, for the stress test only: built
// when CMake's TPDECODE_TEST_DELAYS is on (never in a release build; off, the
// kernel holds no trace of them). A delayed CTA spins for a random time at one of
// two points: before its pushes (its peers poll for a late partial) or between its
// pushes and its polls (its partial is out, its reads are late).
#pragma once

#include <cstdint>

namespace tpdecode {

struct TestDelays {
  uint32_t one_in = 0;  // a CTA is delayed at a point with probability 1 / one_in (0: never)
  uint32_t max_ns = 0;  // the delay, uniform in [0, max_ns)
  uint64_t seed = 0;
};

// Sets the delays of every later all-reduce launched on `device`. Throws where the
// library was built without TPDECODE_TEST_DELAYS.
void set_test_delays(int device, const TestDelays& delays);
// Whether the library was built with them.
bool test_delays_built();
// The device variable the kernel reads, on the current device (all_reduce.cu:
// defined only in a build with them).
void* test_delays_address();

}  // namespace tpdecode
