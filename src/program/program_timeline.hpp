// What a GemmProgram's timelines (GemmProgram::timelines) say about its op
// boundaries: the figures `tpdecode bench chain --timeline` prints, means over the
// runs and the ops of each run (docs/performance.md, "Chains").
#pragma once

#include <vector>

#include "tpdecode/gemm_program.hpp"

namespace tpdecode::program {

struct BoundaryFigures {
  int runs = 0;
  double span_us = 0;        // a run: the last epilogue's end - the first start
  double lateness_us = 0;    // per op: the last CTA's MMA end - the median CTA's
  double epilogue_us = 0;    // per op: the last epilogue's end - the last MMA end
  double start_us = 0;       // per boundary: the median CTA's start of op i - op i-1's last MMA end
  double last_start_us = 0;  // per boundary: the last CTA's start of op i - op i-1's last MMA end
  // A run: a CTA's weight producer waiting for a free ring stage / under its cap on
  // the bytes in flight, summed over the ops (the mean CTA).
  double ring_full_us = 0;
  double capped_us = 0;
};

// Over the runs; CTAs with no unit of an op (times 0) are left out of that op.
// InvalidArgument for a timeline whose size is not ctas x ops.
BoundaryFigures boundary_figures(const std::vector<GemmProgram::RunTimeline>& runs, int ops);

}  // namespace tpdecode::program
