// One-shot all-reduce kernel: one thread per 16-byte fragment (8 BF16 columns);
// grid (fragment CTAs, rows). All pushes of a thread precede its polls, and the
// launcher guarantees every rank's grid is co-resident, so a poll only waits on
// CTAs that are running or done.
#pragma once

#include "comm/lamport_device.cuh"
#include "comm/all_reduce_launch.hpp"

namespace tpdecode {

inline constexpr int kAllReduceThreads = 128;

template <int kRanks>
__global__ void __launch_bounds__(kAllReduceThreads) all_reduce_kernel(AllReduceParams p) {
  using namespace lamport;
  const int frag = blockIdx.x * kAllReduceThreads + threadIdx.x;
  const int row = blockIdx.y;
  if (p.trigger_early) launch_dependents();
  wait_prerequisites();  // no mailbox store before the previous kernel completed
  if (frag >= p.frags) return;
  DeviceMemory mem(p.timeout_ns);
  const Fragment mine = load_fragment(static_cast<const Fragment*>(p.x) + static_cast<long>(row) * p.frags + frag);
  push_to_all<kRanks>(
      mem, [&](int peer) { return slot_fragment(p.box.base[peer], p.rank, p.rows_cap, p.row_bytes, row, frag); },
      mine);
  void* own = p.box.base[p.rank];
  auto slot_of = [&](int s) { return slot_fragment(own, s, p.rows_cap, p.row_bytes, row, frag); };
  Fragment raw[kRanks];
  const int missing = wait_all<kRanks>(mem, slot_of, raw);
  if (missing >= 0) {
    record_timeout(p.error, p.rank, CommOp::kAllReduce, p.parity, missing, row, frag * 8);
    return;
  }
  // Why late with several ranks on one GPU: see ar_norm.cuh (a dependent grid
  // launched early could hold SM slots a peer's grid of this call still needs).
  if (!p.trigger_early) launch_dependents();
  rearm<kRanks>(mem, slot_of);
  store_fragment(static_cast<Fragment*>(p.out) + static_cast<long>(row) * p.frags + frag, sum_rank_order<kRanks>(raw));
}

}  // namespace tpdecode
