// Launcher of the ArNorm kernel (ar_norm.cu); arguments are checked by the caller
// (ar_norm.cpp).
#pragma once

#include "tpdecode/team.hpp"

namespace tpdecode {

struct ArNormParams {
  PeerPointers box;      // every rank's [TP, rows_cap, row_bytes] at this parity
  const void* x;         // [rows, hidden] bf16
  const void* residual;  // [rows, hidden] bf16, or nullptr: none
  const void* weight;    // [hidden] bf16
  void* out;             // [rows, hidden] bf16
  void* residual_out;    // [rows, hidden] bf16
  float eps;
  int hidden;
  int rank;
  int parity;
  int rows_cap;
  long row_bytes;
  bool trigger_early;  // launch dependents before the polls (one rank per GPU)
  uint64_t timeout_ns;
  MailboxError* error;
};

// Refuses (CapacityError) a grid the ranks on this GPU could not all hold.
void launch_ar_norm(const RankContext& ctx, const ArNormParams& p, int rows);

// Rows whose grid every rank on ctx's GPU can hold at once.
int ar_norm_resident_rows(const RankContext& ctx, int hidden);

}  // namespace tpdecode
