// A set of CUDA devices, safe to share between threads: which devices a one-time
// per-device preparation (kernel attributes) was done on. Two threads may both do
// it for a device before either marks it: the preparations must be idempotent.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "tpdecode/error.hpp"

namespace tpdecode {

class DeviceSet {
 public:
  // Whether the current device is in the set.
  bool has_current() const { return (bits_.load() & current_bit()) != 0; }
  void add_current() { bits_.fetch_or(current_bit()); }

 private:
  static uint64_t current_bit() {
    int device = 0;
    TPD_CUDA(cudaGetDevice(&device));
    return uint64_t{1} << (device % 64);
  }
  std::atomic<uint64_t> bits_{0};
};

}  // namespace tpdecode
