// The device side of test_delays.hpp: one TestDelays per device, read by the
// all-reduce kernel's CTAs at its two delay points. Included by all_reduce.cu alone
// (whole-program compilation: the variable must live in the kernel's unit, which
// also holds the host setter).
#pragma once

#include "comm/test_delays.hpp"
#include "core/device.cuh"
#include "core/hash.hpp"

namespace tpdecode {

#if defined(TPDECODE_TEST_DELAYS)
__device__ TestDelays g_test_delays;

// Each thread draws from the timer's microsecond, its CTA and the point: a CTA's
// threads mostly draw alike (mostly a whole CTA late), and calls draw anew.
__device__ __forceinline__ void test_delay(int point) {
  const TestDelays d = g_test_delays;
  if (d.one_in == 0) return;
  const uint64_t now = dev::global_timer_ns();
  const uint64_t key = (now / 1000) * 64 + blockIdx.x * 8 + blockIdx.y * 2 + static_cast<uint64_t>(point);
  const uint64_t h = hash::keyed(d.seed, key);
  if (h % d.one_in != 0) return;
  const uint64_t until = now + (h >> 32) % d.max_ns;
  while (dev::global_timer_ns() < until) {
  }
}
#else
__device__ __forceinline__ void test_delay(int) {}
#endif

}  // namespace tpdecode
