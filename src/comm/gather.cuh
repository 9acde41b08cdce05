// The Gather kernel: grid (CTAs per row, rows). A thread pushes its share of the
// row's shard fragments to every rank, then polls its share of the gathered row in
// its own mailbox. All pushes of a thread precede its polls, and the
// launcher guarantees every rank's grid is co-resident, so a poll only waits on
// CTAs that are running or done.
#pragma once

#include "comm/gather_launch.hpp"
#include "comm/lamport_device.cuh"
#include "tpdecode/gather.hpp"

namespace tpdecode {

template <int kRanks>
__global__ void __launch_bounds__(kGatherThreads) gather_kernel(GatherParams p) {
  using namespace lamport;
  const int row = blockIdx.y;
  const int first = blockIdx.x * kGatherThreads + threadIdx.x;
  const int step = gridDim.x * kGatherThreads;
  wait_prerequisites();  // no mailbox store before the previous kernel completed
  DeviceMemory mem(p.timeout_ns);
  const Fragment* shard = static_cast<const Fragment*>(p.shard) + static_cast<long>(row) * p.shard_frags;
  for (int f = first; f < p.shard_frags; f += step) {
    const int column = p.rank * p.shard_frags + f;  // fragment in the gathered row
    push_to_all<kRanks>(
        mem, [&](int peer) { return slot_fragment(p.box.base[peer], 0, p.rows_cap, p.row_bytes, row, column); },
        load_fragment(shard + f));
  }
  // Why not early with several ranks on one GPU: see ar_norm.cuh.
  if (p.trigger_early) launch_dependents();
  void* own = p.box.base[p.rank];
  Fragment* out = static_cast<Fragment*>(p.out) + static_cast<long>(row) * p.shard_frags * kRanks;
  for (int f = first; f < p.shard_frags * kRanks; f += step) {
    Fragment* slot = slot_fragment(own, 0, p.rows_cap, p.row_bytes, row, f);
    Fragment raw[1];
    if (wait_all<1>(mem, [&](int) { return slot; }, raw) >= 0) {
      record_timeout(p.error, p.rank, CommOp::kGather, p.parity, f / p.shard_frags, row, f * 4);
      return;
    }
    if (p.copy) {
      store_fragment(out + f, raw[0]);
      mem.store(slot, armed());
    }
  }
  if (!p.trigger_early) launch_dependents();
}

}  // namespace tpdecode
