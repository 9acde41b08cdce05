// Launcher of the one-shot all-reduce kernel (all_reduce.cu); arguments are
// checked by the caller (all_reduce.cpp).
#pragma once

#include "tpdecode/team.hpp"

namespace tpdecode {

struct AllReduceParams {
  PeerPointers box;   // every rank's [TP, rows_cap, row_bytes] at this parity
  const void* x;      // [rows, hidden] bf16
  void* out;          // [rows, hidden] bf16
  int rank;
  int parity;
  int rows_cap;
  int frags;          // hidden / 8
  long row_bytes;
  uint64_t timeout_ns;
  MailboxError* error;
  bool trigger_early;  // launch dependents before the polls (one rank per GPU)
};

// CTAs of the kernel this rank may launch at once (coresident_ctas_per_rank).
int all_reduce_ctas_per_rank(const RankContext& ctx);

// CTAs of one row.
inline int all_reduce_ctas_per_row(int frags) { return (frags + 127) / 128; }

// Refuses (CapacityError) a grid the ranks on this GPU could not all hold.
void launch_all_reduce(const RankContext& ctx, const AllReduceParams& p, int rows);

}  // namespace tpdecode
