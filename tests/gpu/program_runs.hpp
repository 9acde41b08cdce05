// GemmProgram tests' runs: the bits of a program's outputs after a first run, the
// check that later runs (back to back with PDL) give them again, and the check of a
// program's recorded timelines.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
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

// The program's last runs (`runs` of them): for every CTA its SM (below the GPU's
// count) and, per op of its units, a start, an MMA end and an epilogue end in that
// order; every op on some CTA; each run after the previous one; a CTA's weight
// producer waiting (for free stages and under its cap) no longer than the run.
inline void expect_timelines(const GemmProgram& program, std::size_t runs) {
  int device = 0, sms = 0;
  TPD_CUDA(cudaGetDevice(&device));
  TPD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const std::vector<GemmProgram::RunTimeline> timelines = program.timelines();
  ASSERT_EQ(timelines.size(), runs);
  const auto ops = static_cast<std::size_t>(program.ops());
  uint64_t previous_end = 0;
  for (const GemmProgram::RunTimeline& t : timelines) {
    ASSERT_EQ(t.sm.size(), static_cast<std::size_t>(program.ctas()));
    ASSERT_EQ(t.ops.size(), t.sm.size() * ops);
    uint64_t first_start = ~uint64_t{0}, last_end = 0;
    std::vector<uint64_t> producer_waits(t.sm.size());
    int recorded = 0;
    for (std::size_t i = 0; i < t.ops.size(); ++i) {
      EXPECT_LT(t.sm[i / ops], static_cast<uint32_t>(sms));
      const GemmProgram::OpTimes& o = t.ops[i];
      if (o.start_ns == 0) continue;
      ++recorded;
      producer_waits[i / ops] += o.ring_full_ns + o.capped_ns;
      EXPECT_LE(o.start_ns, o.mma_end_ns) << "entry " << i;
      EXPECT_LE(o.mma_end_ns, o.epilogue_end_ns) << "entry " << i;
      first_start = std::min(first_start, o.start_ns);
      last_end = std::max(last_end, o.epilogue_end_ns);
    }
    EXPECT_GE(recorded, program.ops()) << "every op has a CTA";
    for (std::size_t c = 0; c < producer_waits.size(); ++c)
      EXPECT_LE(producer_waits[c], last_end - first_start) << "CTA " << c << "'s producer waited longer than the run";
    EXPECT_GT(first_start, previous_end) << "the runs out of order";
    previous_end = last_end;
  }
}

}  // namespace tpdecode::test
