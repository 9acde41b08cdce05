// The ArNorm kernel: one-shot all-reduce + residual add + RMSNorm of one row per
// 8-CTA cluster (include/tpdecode/ar_norm.hpp has the contract and the order).
// Every thread pushes before it polls, and the launcher guarantees every rank's
// grid is co-resident, so a poll only waits on CTAs that are running or done.
#pragma once

#include "comm/ar_norm_launch.hpp"
#include "comm/lamport_device.cuh"
#include "comm/row_norm.cuh"

namespace tpdecode {

inline constexpr int kArNormMaxThreads = rownorm::kMaxWarps * 32;

template <int kRanks>
__global__ void __launch_bounds__(kArNormMaxThreads) ar_norm_kernel(ArNormParams p) {
  using namespace lamport;
  __shared__ rownorm::RowSumShared shared;
  rownorm::cluster_arrive_started();
  const int row = blockIdx.y;
  const int frags_per_cta = p.hidden / (8 * kArNormCtas);
  const bool active = static_cast<int>(threadIdx.x) < frags_per_cta;
  const int frag = blockIdx.x * frags_per_cta + threadIdx.x;
  const long at = static_cast<long>(row) * (p.hidden / 8) + frag;  // fragment index in [rows, hidden]
  Fragment weight{};
  // Why before the wait: the weight is a parameter, not an output of the previous
  // kernel; its load overlaps that kernel's tail.
  if (active) weight = load_fragment(static_cast<const Fragment*>(p.weight) + frag);
  if (p.trigger_early) launch_dependents();
  wait_prerequisites();  // no mailbox store before the previous kernel completed
  Fragment fresh{};      // the new residual (zeros in threads without a fragment)
  bool ok = true;
  if (active) {
    DeviceMemory mem(p.timeout_ns);
    push_to_all<kRanks>(
        mem, [&](int peer) { return slot_fragment(p.box.base[peer], p.rank, p.rows_cap, p.row_bytes, row, frag); },
        load_fragment(static_cast<const Fragment*>(p.x) + at));
    const Fragment old = p.residual ? load_fragment(static_cast<const Fragment*>(p.residual) + at) : Fragment{};
    void* own = p.box.base[p.rank];
    auto slot_of = [&](int s) { return slot_fragment(own, s, p.rows_cap, p.row_bytes, row, frag); };
    Fragment raw[kRanks];
    const int missing = wait_all<kRanks>(mem, slot_of, raw);
    if (missing >= 0) {
      record_timeout(p.error, p.rank, CommOp::kArNorm, p.parity, missing, row, frag * 8);
      ok = false;  // Why no return: the cluster barrier below needs every thread
    } else {
      rearm<kRanks>(mem, slot_of);
      fresh = sum_rank_order<kRanks>(raw);
      if (p.residual) fresh = rownorm::add_residual(fresh, old);
      store_fragment(static_cast<Fragment*>(p.residual_out) + at, fresh);
    }
  }
  // Why late with several ranks on one GPU: a dependent grid launched early holds SM
  // slots that a peer's grid of this call may still need (the co-residency check
  // counts one grid per rank). Once every thread has seen every peer's push, every
  // peer's grid of this call is resident, and the trigger can block nobody.
  if (!p.trigger_early) launch_dependents();
  const float total = rownorm::cluster_row_sum(rownorm::thread_squares(fresh), shared);
  if (active && ok)
    store_fragment(static_cast<Fragment*>(p.out) + at,
                   rownorm::normed(fresh, weight, rownorm::rstd(total, p.hidden, p.eps)));
}

}  // namespace tpdecode
