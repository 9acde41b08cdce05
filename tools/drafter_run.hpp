// One measurement of the drafter step on a team: per row count, both paths' step
// times and breakdowns (graph replays), and the comparison of their outputs; at TP 1
// the program path's step too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "drafter/config.hpp"
#include "drafter/token_agreement.hpp"
#include "tpdecode/oproj.hpp"
#include "tpdecode/team.hpp"

namespace tpdecode::cli {

// Per-step medians of graph replays (one step per graph, replayed back to back).
// gemm / collective / other: graphs holding only that kind of op, timed alone
// (they overlap in the full step, so they need not add up to it).
struct PathTimes {
  double step_us = 0, gemm_us = 0, collective_us = 0, other_us = 0;
};

struct DrafterRow {
  int m = 0;
  PathTimes stock, specialised;
  int token_disagreements = 0;  // rows whose draft tokens differ between the paths
  int disagreements_near_tie = 0;  // of those, stock's top-2 gap within kNearTieUlps ulps
  double max_logit_diff = 0;       // largest |stock - specialised| logit (NaN where one is NaN)
  int non_finite_logits = 0;       // NaN or infinite logits of the stock, specialised and program paths
  bool repeat_bitwise = false;     // specialised logits: eager run == graph replay, bit for bit
  bool ranks_identical = false;    // every driven rank's specialised logits identical
  uint64_t logits_hash = 0;        // FNV-1a of the specialised logits (ranks of an NCCL team compare it)
  // The program path (TP 1 only; step_us 0 where it did not run): the form it ran
  // in, its step, its tokens against the stock path's, its logits eager == graph
  // replay.
  struct Program {
    std::string form;  // drafter::form_name
    double step_us = 0;
    int token_disagreements = 0;
    int disagreements_near_tie = 0;
    bool repeat_bitwise = false;
  } program;
};

// A disagreement counts as a near tie when the stock logits of the two tokens are
// within this many BF16 ulps of the larger one.
using drafter::kNearTieUlps;

struct DrafterRunOptions {
  std::vector<int> rows;
  int replays = 30;
  bool verbose = true;  // progress on stderr
  std::optional<OprojKind> oproj;  // the fused o-projection's kind forced (empty: its rule table)
};

// Builds the drafter on `team` (collective) and measures every row count, appending
// each row to `rows` as it completes (a failure keeps the rows measured before it).
void measure_drafter(Team& team, const drafter::DrafterConfig& config, const DrafterRunOptions& options,
                     std::vector<DrafterRow>& rows, std::string* comm_note);

}  // namespace tpdecode::cli
