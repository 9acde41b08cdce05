// Which path serves a call: pure functions of the limits fixed when a TpComm is
// built and of the call's shape (tested on the CPU). Arguments are validated
// before these run (tp_comm.cpp): a refusal is never a bad argument, only a call
// the mailboxes do not take, which then runs the stock path.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/crossover.hpp"
#include "tpdecode/comm.hpp"

namespace tpdecode {

struct CommLimits {
  int team_size = 1;
  bool shares_memory = false;  // the team's ranks reach each other's memory
  int64_t hidden = 0;          // columns of a one-shot mailbox row
  int rows_cap = 0;
  int64_t gather_row_bytes = 0;
  // Rows whose grids every rank on one GPU can hold at once (spin-waiting CTAs
  // must be co-resident), at the widest row.
  int one_shot_rows = 0;
  int ar_norm_rows = 0;
  int gather_rows = 0;
  // The two-shot's grids loop over rows: they serve rows_cap rows wherever one CTA
  // (one cluster for the norm) per rank fits, else 0.
  int two_shot_rows = 0;
  int two_shot_norm_rows = 0;
  bool one_gpu = false;          // every rank on one GPU (the local team): the crossover table's transport
  bool batch_invariant = false;  // CommConfig::batch_invariant
};

// Argument checks (InvalidArgument naming the problem), the same for every path.
// check_norm_eps: an RMSNorm's eps must be finite and >= 0 (a negative one can make
// the mean plus eps negative, its reciprocal square root NaN; a NaN one poisons every
// row): every norm of the library takes it (ar_norm, the o-projection's epilogues).
void check_norm_eps(float eps, const char* op);
void check_all_reduce(const AllReduceIo& io);
void check_ar_norm(const ArNormIo& io);
void check_gather(const GatherIo& io, int team_size);

// "" when the one-shot all-reduce serves [rows, width] bf16, else why not.
std::string one_shot_refusal(const CommLimits& limits, int64_t rows, int64_t width);
// "" when ArNorm serves [rows, hidden], else why not.
std::string ar_norm_refusal(const CommLimits& limits, int64_t rows, int64_t hidden);
// "" when the gather serves [rows, shard_bytes] shards of `dtype`, else why not.
std::string gather_refusal(const CommLimits& limits, int64_t rows, int64_t shard_bytes, DType dtype);

// "" when the two-shot all-reduce (its ArNorm: `norm`) serves [rows, width] bf16,
// else why not.
std::string two_shot_refusal(const CommLimits& limits, int64_t rows, int64_t width, bool norm);

// The path `table` (crossover.hpp's rules) names for a call of this team size,
// transport and op at [rows, width], if it names one.
std::optional<CommPath> crossover_choice(std::span<const CrossoverEntry> table, int tp, CommTransport transport,
                                         bool norm, int64_t width, int64_t rows);

// The path an all-reduce (or ArNorm: `norm`) of [rows, width] takes under
// `algorithm`, and why not a mailbox path when it is the stock one. kAuto takes the
// path `table` names where it serves, else the one-shot where it serves, else the
// stock path; batch-invariant, a mailbox path wherever one serves (the two-shot
// first: it holds more rows).
CommResult choose_all_reduce(const CommLimits& limits, CommAlgorithm algorithm, int64_t rows, int64_t width, bool norm,
                             std::span<const CrossoverEntry> table = kCrossover);

// The calls one all_reduce / ar_norm / gather runs as: one, or (batch-invariant)
// rows beyond what the mailbox paths hold split into further calls of as many rows
// as they hold (rows_cap for stock calls where no mailbox path serves the shape).
struct CommCall {
  int64_t first = 0;  // the call's first row
  int64_t rows = 0;
  CommPath path = CommPath::kStock;
};
struct CommPlan {
  std::vector<CommCall> calls;
  CommResult result;  // the first call's path; why: that call's, and the split
};
CommPlan plan_all_reduce(const CommLimits& limits, CommAlgorithm algorithm, int64_t rows, int64_t width, bool norm,
                         std::span<const CrossoverEntry> table = kCrossover);
CommPlan plan_gather(const CommLimits& limits, CommAlgorithm algorithm, int64_t rows, int64_t shard_bytes, DType dtype);

}  // namespace tpdecode
