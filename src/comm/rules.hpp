// Which path serves a call: pure functions of the limits fixed when a TpComm is
// built and of the call's shape (tested on the CPU). Arguments are validated
// before these run (tp_comm.cpp): a refusal is never a bad argument, only a call
// the mailboxes do not take, which then runs the stock path.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

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
  bool one_gpu = false;  // every rank on one GPU (the local team): the crossover table's transport
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
// The rows [first, last] for which the crossover table (crossover.hpp) takes the
// two-shot, for this team and op at `width` columns (first = kNever: never).
std::pair<int, int> two_shot_rows_for(const CommLimits& limits, int64_t width, bool norm);

// The path an all-reduce (or ArNorm: `norm`) of [rows, width] takes under
// `algorithm`, and why not a mailbox path when it is the stock one. kAuto takes the
// one path that serves, or the crossover table's choice where both do.
CommResult choose_all_reduce(const CommLimits& limits, CommAlgorithm algorithm, int64_t rows, int64_t width, bool norm);

}  // namespace tpdecode
