// Launcher of the Gather kernel (gather.cu); arguments are checked by the caller
// (gather.cpp).
#pragma once

#include "tpdecode/team.hpp"

namespace tpdecode {

struct GatherParams {
  PeerPointers box;   // every rank's [1, rows_cap, row_bytes] at this parity
  const void* shard;  // [rows, shard_frags] 16-byte fragments
  void* out;          // [rows, TP · shard_frags] fragments (copy mode)
  int rank;
  int parity;
  int rows_cap;
  long row_bytes;
  int shard_frags;
  bool copy;          // copy out and re-arm, else leave in place
  bool trigger_early; // launch dependents after the pushes (one rank per GPU), else after the polls
  uint64_t timeout_ns;
  MailboxError* error;
};

// Refuses (CapacityError) a grid the ranks on this GPU could not all hold.
void launch_gather(const RankContext& ctx, const GatherParams& p, int rows);

// CTAs of the gather kernel this rank may launch at once (coresident_ctas_per_rank).
int gather_ctas_per_rank(const RankContext& ctx);

}  // namespace tpdecode
