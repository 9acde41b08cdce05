#include "program/program_timeline.hpp"

#include <algorithm>
#include <cstdint>

#include "core/check.hpp"
#include "core/graph_timing.hpp"

namespace tpdecode::program {
namespace {

// One op's times over the CTAs that ran it (ns).
struct OpColumn {
  std::vector<double> start, mma_end, epilogue_end;
};

}  // namespace

BoundaryFigures boundary_figures(const std::vector<GemmProgram::RunTimeline>& runs, int ops) {
  check(ops > 0, "program timeline: {} ops", ops);
  BoundaryFigures f;
  double span = 0, lateness = 0, epilogue = 0, start = 0, last_start = 0, ring_full = 0, capped = 0;
  int op_count = 0, boundaries = 0;
  for (const GemmProgram::RunTimeline& run : runs) {
    check(run.ops.size() == run.sm.size() * static_cast<std::size_t>(ops),
          "program timeline: {} entries for {} CTAs x {} ops", run.ops.size(), run.sm.size(), ops);
    std::vector<OpColumn> column(static_cast<std::size_t>(ops));
    double run_ring_full = 0, run_capped = 0;
    for (std::size_t i = 0; i < run.ops.size(); ++i) {
      const GemmProgram::OpTimes& t = run.ops[i];
      if (t.start_ns == 0) continue;
      run_ring_full += static_cast<double>(t.ring_full_ns);
      run_capped += static_cast<double>(t.capped_ns);
      OpColumn& c = column[i % static_cast<std::size_t>(ops)];
      c.start.push_back(static_cast<double>(t.start_ns));
      c.mma_end.push_back(static_cast<double>(t.mma_end_ns));
      c.epilogue_end.push_back(static_cast<double>(t.epilogue_end_ns));
    }
    double first = 0, end = 0, previous_mma_end = -1;
    bool any = false;
    for (const OpColumn& c : column) {
      if (c.start.empty()) continue;
      const double op_start = *std::min_element(c.start.begin(), c.start.end());
      const double last_mma = *std::max_element(c.mma_end.begin(), c.mma_end.end());
      const double last_epilogue = *std::max_element(c.epilogue_end.begin(), c.epilogue_end.end());
      first = any ? std::min(first, op_start) : op_start;
      end = any ? std::max(end, last_epilogue) : last_epilogue;
      any = true;
      lateness += last_mma - median(c.mma_end);
      epilogue += last_epilogue - last_mma;
      ++op_count;
      if (previous_mma_end >= 0) {
        start += median(c.start) - previous_mma_end;
        last_start += *std::max_element(c.start.begin(), c.start.end()) - previous_mma_end;
        ++boundaries;
      }
      previous_mma_end = last_mma;
    }
    if (!any) continue;
    span += end - first;
    ring_full += run_ring_full / static_cast<double>(run.sm.size());
    capped += run_capped / static_cast<double>(run.sm.size());
    ++f.runs;
  }
  if (f.runs > 0) {
    f.span_us = span / f.runs / 1e3;
    f.ring_full_us = ring_full / f.runs / 1e3;
    f.capped_us = capped / f.runs / 1e3;
  }
  if (op_count > 0) {
    f.lateness_us = lateness / op_count / 1e3;
    f.epilogue_us = epilogue / op_count / 1e3;
  }
  if (boundaries > 0) {
    f.start_us = start / boundaries / 1e3;
    f.last_start_us = last_start / boundaries / 1e3;
  }
  return f;
}

}  // namespace tpdecode::program
