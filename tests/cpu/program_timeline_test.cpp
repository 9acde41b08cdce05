// The boundary figures of GemmProgram's timelines (program_timeline.hpp) on
// timelines whose figures are known: CTAs that start and end an op at different
// times, a CTA with no unit of an op, two runs.
#include <gtest/gtest.h>

#include "program/program_timeline.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::program {
namespace {

using Times = GemmProgram::OpTimes;

// Three CTAs, two ops; CTA 2 has no unit of op 1. `shift` moves the whole run,
// `late` CTA 1's start of op 1.
GemmProgram::RunTimeline run(uint64_t shift, uint64_t late) {
  GemmProgram::RunTimeline t;
  t.sm = {4, 7, 9};
  t.ops = {Times{shift + 1000, shift + 5000, shift + 6000, 300, 30},
           Times{shift + 8000, shift + 12000, shift + 13000, 600, 0},
           Times{shift + 1200, shift + 6000, shift + 9000, 0, 90},
           Times{shift + late, shift + 14000, shift + 15000, 900, 60},
           Times{shift + 1100, shift + 4000, shift + 4500, 1200, 0},
           Times{}};
  return t;
}

TEST(ProgramTimeline, FiguresOfKnownRuns) {
  const BoundaryFigures f = boundary_figures({run(0, 9000), run(100000, 10000)}, 2);
  EXPECT_EQ(f.runs, 2);
  EXPECT_DOUBLE_EQ(f.span_us, 14.0);        // 1000 .. 15000 ns in each run
  EXPECT_DOUBLE_EQ(f.lateness_us, 1.0);     // op 0: 6000 - median 5000; op 1: 14000 - 13000
  EXPECT_DOUBLE_EQ(f.epilogue_us, 2.0);     // op 0: 9000 - 6000; op 1: 15000 - 14000
  EXPECT_DOUBLE_EQ(f.start_us, 2.75);       // median start of op 1 - 6000: 2500, then 3000
  EXPECT_DOUBLE_EQ(f.last_start_us, 3.5);   // 3000, then 4000
  EXPECT_DOUBLE_EQ(f.ring_full_us, 1.0);    // (300 + 600 + 0 + 900 + 1200) / 3 CTAs
  EXPECT_DOUBLE_EQ(f.capped_us, 0.06);      // (30 + 90 + 60) / 3
}

TEST(ProgramTimeline, NoRunsAndBadSizes) {
  EXPECT_EQ(boundary_figures({}, 2).runs, 0);
  GemmProgram::RunTimeline bad = run(0, 9000);
  bad.ops.pop_back();
  EXPECT_THROW(boundary_figures({bad}, 2), InvalidArgument);
  EXPECT_THROW(boundary_figures({run(0, 9000)}, 0), InvalidArgument);
}

}  // namespace
}  // namespace tpdecode::program
