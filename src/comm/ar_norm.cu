// The ArNorm kernel: one-shot all-reduce + residual add + RMSNorm of one row per
// 8-CTA cluster, CTA c owning columns [c·H/8, (c+1)·H/8), one 16-byte fragment
// (8 columns) per thread. The all-reduce is collectives.hpp's one-shot; the norm's
// math and summation order are row_norm.cuh's.
// Programmatic dependent launch: the weight loads before griddepcontrol.wait, no
// mailbox store precedes it; dependents are triggered at once with one rank per
// GPU, after the polls when ranks share a GPU (why: all_reduce.cu).
// A failed fragment (timeout, abort) poisons its residual and, through a NaN sum of
// squares, every output of its row: an output is correct or NaN, never wrong.
#include "comm/collectives.hpp"
#include "comm/row_norm.cuh"
#include "tpdecode/device.cuh"
#include "tpdecode/launch.cuh"
#include "core/rank_switch.hpp"

namespace tpdecode {
namespace {

template <int kRanks>
__global__ void __launch_bounds__(kArNormMaxThreads) ar_norm_kernel(const ArNormParams p) {
  using namespace lamport;
  __shared__ rownorm::RowSumShared shared;
  __shared__ uint32_t entry;
  rownorm::cluster_arrive_started();
  const int row = blockIdx.y;
  const int frags_per_cta = p.hidden / (8 * kArNormCtas);
  const bool active = static_cast<int>(threadIdx.x) < frags_per_cta;
  const int frag = blockIdx.x * frags_per_cta + threadIdx.x;
  const long at = static_cast<long>(row) * (p.hidden / 8) + frag;  // fragment index in [rows, hidden]
  Fragment weight{};
  // Why before the wait: the weight is a parameter, not an output of the previous
  // kernel; its load overlaps that kernel's tail.
  if (active) weight = static_cast<const Fragment*>(p.weight)[frag];
  if (p.trigger_early) dev::pdl_launch_dependents();
  dev::pdl_wait();
  // Why before the entry: the inputs' loads and the entry's round trip overlap.
  Fragment mine{}, old{};
  if (active) {
    mine = static_cast<const Fragment*>(p.x)[at];
    if (p.residual) old = static_cast<const Fragment*>(p.residual)[at];
  }
  Memory mem(p.team.timeout_ns);
  uint32_t epoch = 0;
  if (threadIdx.x == 0) entry = begin(mem, p.team, p.box, Op::kArNorm, &epoch);
  __syncthreads();
  bool ok = entry != kAbortedEntry;
  uint32_t ticket = 0;  // thread 0's arrival, read at the end (its wait off the row's path)
  Fragment fresh{};  // the new residual (zeros in threads without a fragment)
  if (active && ok) {
    const Call call{Op::kArNorm, static_cast<int>(entry)};
    if (p.system_fence) dev::fence_acq_rel_sys();
    one_shot_push<kRanks>(mem, p.team, p.box, call, row, frag, mine);
    ticket = threadIdx.x == 0 ? take_ticket(mem, p.team, p.box) : 0u;
    ok = one_shot_collect<kRanks>(mem, p.team, p.box, call, row, frag, &fresh);
    if (ok && p.residual) fresh = rownorm::add_residual(fresh, old);
  }
  if (active) static_cast<Fragment*>(p.residual_out)[at] = ok ? fresh : poisoned();
  if (!p.trigger_early) dev::pdl_launch_dependents();
  const float squares = ok ? rownorm::thread_squares(fresh) : __int_as_float(0x7fc00000);
  const float total = rownorm::cluster_row_sum(squares, shared);
  if (active)
    static_cast<Fragment*>(p.out)[at] = rownorm::normed(fresh, weight, rownorm::rstd(total, p.hidden, p.eps));
  if (threadIdx.x == 0 && entry != kAbortedEntry)
    advance_if_last(mem, p.team, p.box, epoch, ticket, gridDim.x * gridDim.y);
}

template <int kRanks>
const void* kernel_symbol() {
  return reinterpret_cast<const void*>(&ar_norm_kernel<kRanks>);
}

}  // namespace

int ar_norm_resident_rows(const RankContext& ctx, int64_t hidden) {
  return with_rank_count(ctx.size, [&](auto ranks) {
    const int ctas = coresident_ctas_per_rank(ctx, kernel_symbol<decltype(ranks)::value>(), ar_norm_threads(hidden),
                                              0, kArNormCtas);
    return ctas / kArNormCtas;
  });
}

void launch_ar_norm(const RankContext& ctx, cudaStream_t stream, const ArNormParams& p, int rows) {
  LaunchShape s;
  s.grid = dim3(kArNormCtas, static_cast<unsigned>(rows));
  s.block = dim3(static_cast<unsigned>(ar_norm_threads(p.hidden)));
  s.cluster = kArNormCtas;
  s.pdl = ctx.pdl;
  with_rank_count(ctx.size, [&](auto ranks) { launch_kernel(ar_norm_kernel<decltype(ranks)::value>, s, stream, p); });
}

}  // namespace tpdecode
