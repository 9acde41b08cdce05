// CommLimits of the teams the CPU tests of the comm rules reason about.
#pragma once

#include "comm/rules.hpp"

namespace tpdecode::test {

// A local team of 8 on one H200 at hidden 7168 (one-shot 21 rows, ArNorm 7).
inline CommLimits tp8_limits() {
  CommLimits l;
  l.team_size = 8;
  l.shares_memory = true;
  l.hidden = 7168;
  l.rows_cap = 64;
  l.gather_row_bytes = 7168 * 2;
  l.one_shot_rows = 21;
  l.ar_norm_rows = 7;
  l.gather_rows = 64;
  return l;
}

// With the two-shot's grids, which loop over rows: every row count up to rows_cap.
inline CommLimits with_two_shot(CommLimits l, bool one_gpu) {
  l.two_shot_rows = l.rows_cap;
  l.two_shot_norm_rows = l.rows_cap;
  l.one_gpu = one_gpu;
  return l;
}

}  // namespace tpdecode::test
