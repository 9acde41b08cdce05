// What kernel launchers need to know about one rank a Team drives, and the
// co-residency budget of spin-waiting kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "comm/protocol.hpp"
#include "tpdecode/team.hpp"

namespace tpdecode {

struct RankContext {
  int rank = 0;
  int size = 1;
  int device = 0;
  cudaStream_t stream = nullptr;  // the team's stream for this rank
  // Ranks whose spin-waiting kernels share this GPU (the local team: all of them).
  // Launchers refuse a grid that could not be resident ranks_on_device times over.
  int ranks_on_device = 1;
  bool pdl = true;  // the team's option
  // PDL for kernels that would overlap a co-resident rank's spinning ones otherwise:
  // the team's option, on a GPU of the rank's own (where ranks share a GPU, PDL and
  // co-resident spinning ranks have timed out: docs/performance.md, Known issues).
  bool pdl_on_own_gpu() const { return pdl && ranks_on_device == 1; }
  // The team as this rank's kernels see it: every rank's control block, this
  // rank's error record (device address of host-mapped memory), the deadline.
  lamport::TeamRef team{};
  const volatile lamport::ErrorRecord* error_host = nullptr;
};

// Number of CTAs of `kernel` (with `block` threads, `smem` dynamic bytes and
// `cluster` CTAs per cluster) that one device can hold at once.
int resident_ctas(const void* kernel, int block, std::size_t smem, int cluster, int device);

// CTAs of `kernel` one rank may launch at once: the device's capacity shared by
// the ctx.ranks_on_device ranks on it. Why the margin: for clusters on a shared GPU
// (the local team) only half of that, because the occupancy query counts an empty
// GPU with ideal GPC packing, while the ranks' clusters arrive at different times
// around other kernels (local TP 8 ArNorm timed out at 14 rows of a 15-row rule).
int coresident_ctas_per_rank(const RankContext& ctx, const void* kernel, int block, std::size_t smem,
                             int cluster = 1);

}  // namespace tpdecode
