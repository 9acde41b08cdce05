// GemmProgram tests' runs: the bits of a program's outputs after a first run, and
// the check that later runs (back to back with PDL) give them again.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gpu/gpu_test_util.hpp"
#include "tpdecode/gemm_program.hpp"

namespace tpdecode::test {

// Runs `program` three times, every output poisoned before each run (runs 1 and 2
// with PDL); expects run 2's bits to be run 0's and returns run 0's.
inline std::vector<std::vector<uint16_t>> repeatable_bits(const GemmProgram& program,
                                                          const std::vector<DeviceBuffer*>& outs) {
  std::vector<std::vector<uint16_t>> first;
  for (int run = 0; run < 3; ++run) {
    for (DeviceBuffer* b : outs) poison(*b);
    TPD_CUDA(cudaDeviceSynchronize());
    program.run(nullptr, run > 0);
    if (run == 1) continue;  // run 2 follows it back to back
    TPD_CUDA(cudaDeviceSynchronize());
    std::vector<std::vector<uint16_t>> bits;
    for (DeviceBuffer* b : outs) bits.push_back(to_host<uint16_t>(*b, b->bytes() / 2));
    if (run == 0) first = std::move(bits);
    else EXPECT_TRUE(bits == first) << "run 2 differs from run 0";
  }
  return first;
}

}  // namespace tpdecode::test
