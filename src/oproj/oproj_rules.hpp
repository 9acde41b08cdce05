// Which kind serves an o-projection call, and which one runs: pure functions of
// the limits fixed when a PreparedOproj is built and prepared and of the call's
// row count (tested on the CPU), and the rule table: the kinds `tpdecode bench
// oproj` measured faster than the unfused path, the only place that says where a
// fused kind runs by default. Everything not in the table runs unfused.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "tpdecode/oproj.hpp"
#include "tpdecode/team.hpp"

namespace tpdecode {

// Most rows a call takes (the producer's 8 token tiles of 8).
inline constexpr int kOprojMaxRows = 64;

// Fixed when a PreparedOproj is built.
struct OprojLimits {
  TeamKind team = TeamKind::kLocal;
  int team_size = 1;
  bool shares_memory = false;
  int64_t hidden = 0;
  int64_t k = 0;
  int rows_cap = 0;  // the mailbox's rows
  OprojEpilogue epilogue = OprojEpilogue::kArNorm;
  // Rows whose consumer grids every rank on one GPU can hold at once.
  int consumer_rows = 0;
  // Clusters of the two-shot consumer (looping over rows) every rank on one GPU can
  // hold at once; 0: no two-shot mailbox for this shape.
  int two_shot_clusters = 0;
};

// Fixed when m rows are prepared.
struct OprojShape {
  int m = 0;
  int split = 1;         // the producer GEMM's K split
  int fused_ctas = 0;    // CTAs of the fused grid
  int fused_budget = 0;  // CTAs of it one rank may launch, every rank on its GPU resident at once (0: not built)
};

// One measured rule: calls of m_min .. m_max rows on such a team and shape run `kind`.
struct OprojRule {
  TeamKind team;
  int team_size;
  int64_t hidden;
  int64_t k;
  OprojEpilogue epilogue;
  int m_min, m_max;
  OprojKind kind;
  const char* measured;  // the measurement behind it (bench oproj run, unfused vs this kind)
};
// The table (oproj_rules.cpp); refit from `tpdecode bench oproj`, which prints its
// rows for the kinds it measured at least kOprojRuleGain faster than unfused.
std::span<const OprojRule> oproj_rule_table();
inline constexpr double kOprojRuleGain = 1.03;

// The fused kernel's grid for m rows: (H / 64) · split producer CTAs + 8 per row.
int oproj_fused_grid_ctas(int64_t hidden, int split, int m);

// Argument checks (InvalidArgument naming the problem); `k`, `hidden` the weight's.
void check_oproj_io(const OprojArNormIo& io, int64_t hidden, int64_t k);
void check_oproj_io(const OprojAttnResIo& io, int64_t hidden, int64_t k);

// "" when `kind` serves m rows (shape.m) under these limits, else why not.
std::string oproj_refusal(const OprojLimits& limits, const OprojShape& shape, OprojKind kind);

// The kind a call runs: the forced one where it serves, else the table's where it
// serves, else kUnfused; why says why not the forced or measured kind.
OprojResult choose_oproj(const OprojLimits& limits, const OprojShape& shape, std::optional<OprojKind> forced,
                         std::span<const OprojRule> table);

}  // namespace tpdecode
