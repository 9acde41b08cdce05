// The two-shot all-reduce kernels (collectives.hpp's two_shot_push / reduce /
// collect): every rank pushes its chunks to their owners, every owner sums its
// chunks in rank order and broadcasts the sums into every rank's gather row, every
// rank polls its gather row.
//
// Deadlock freedom: each thread makes ALL its pushes, then ALL its owner
// reductions, then its gather polls. A reduction waits only on pushes, a gather
// poll only on reductions, and every rank's grid is co-resident (the budgets
// below), so no wait is circular whatever the row count: grids are bounded by the
// budget and threads loop over their items.
//
// Programmatic dependent launch: no mailbox store and no read of an input before
// griddepcontrol.wait; dependents are triggered at once with one rank per GPU,
// after the polls when ranks share a GPU (why: all_reduce.cu).
#include <algorithm>

#include "comm/collectives.hpp"
#include "comm/kernels.hpp"
#include "comm/row_norm.cuh"
#include "core/device.cuh"
#include "core/launch.cuh"
#include "core/rank_switch.hpp"

namespace tpdecode {
namespace {

using lamport::Fragment;

constexpr int kThreads = 128;  // the all-reduce's CTA

// A call as a thread sees it after its start: whether the team was not aborted,
// and the two halves' calls on the call's parity.
struct Started {
  bool ok;
  lamport::Call reduce, collect;
};

// Every thread of a CTA: PDL (no mailbox store and no input read before the wait),
// load_first() (the thread's first input: its round trip overlaps the entry's),
// then the CTA's entry (protocol.hpp begin()) through `entry` (shared memory);
// thread 0 keeps the epoch for its ticket (take_ticket() after its pushes,
// advance_if_last() at the end: the atomic's round trip stays off the data path).
template <class LoadFirst>
__device__ Started start_call(const TwoShotParams& p, uint32_t& entry, uint32_t* epoch, LoadFirst&& load_first) {
  using namespace lamport;
  if (p.trigger_early) dev::pdl_launch_dependents();
  dev::pdl_wait();
  load_first();
  if (threadIdx.x == 0) {
    Memory mem(p.team.timeout_ns);
    entry = begin(mem, p.team, p.recv, Op::kTwoShotReduce, epoch);
  }
  __syncthreads();
  const int parity = static_cast<int>(entry);
  return {entry != kAbortedEntry, Call{Op::kTwoShotReduce, parity}, Call{Op::kTwoShotGather, parity}};
}

// All-reduce: a grid-stride loop over the row-major fragments of [rows, width]
// (pushes and gather polls) and over this rank's owned chunks [rows, W / 8].
template <int kRanks>
__global__ void __launch_bounds__(kThreads) two_shot_all_reduce_kernel(const TwoShotParams p) {
  using namespace lamport;
  __shared__ uint32_t entry;
  const int row_frags = p.width / 8;
  const int owner_frags = row_frags / kRanks;
  const int items = p.rows * row_frags;
  const int first = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
  const int step = static_cast<int>(gridDim.x) * kThreads;
  uint32_t epoch = 0;
  const Fragment* x = static_cast<const Fragment*>(p.x);
  Fragment head{};  // x[first]
  const auto [entered, reduce, collect] = start_call(p, entry, &epoch, [&] {
    if (first < items) head = x[first];
  });
  Memory mem(p.team.timeout_ns);
  bool ok = entered;
  Fragment* out = static_cast<Fragment*>(p.out);
  if (ok)
    for (int i = first; i < items; i += step)
      two_shot_push(mem, p.team, p.recv, reduce, i / row_frags, i % row_frags, owner_frags, i == first ? head : x[i]);
  const uint32_t ticket = threadIdx.x == 0 && entered ? take_ticket(mem, p.team, p.recv) : 0u;
  for (int j = first; ok && j < items / kRanks; j += step)
    ok = two_shot_reduce<kRanks>(mem, p.team, p.recv, p.gather, reduce, j / owner_frags, j % owner_frags, owner_frags);
  two_shot_gather_phase(mem, p.team);
  // Why out may alias x: out[i] is written after the gather of fragment i, which
  // follows its owner's reduction, which follows the push that read x[i].
  for (int i = first; i < items; i += step) {
    Fragment got = poisoned();
    if (ok) ok = two_shot_collect(mem, p.team, p.gather, collect, i / row_frags, i % row_frags, owner_frags, &got);
    out[i] = ok ? got : poisoned();
  }
  if (threadIdx.x == 0 && entered) advance_if_last(mem, p.team, p.recv, epoch, ticket, gridDim.x * gridDim.y);
  if (!p.trigger_early) dev::pdl_launch_dependents();
}

// ArNorm: ArNorm's row geometry (a cluster of kArNormCtas CTAs per row, thread t of
// CTA c holding fragment c·H/64 + t), so the norm is row_norm.cuh's, bit for bit.
// Cluster y takes rows y, y + clusters, ... (every CTA of a cluster the same rows,
// so every thread reaches each row's cluster barrier). The owned chunk k of a row
// is reduced by the thread holding fragment rank·W/8 + k (two_shot_own_chunk).
// A failed fragment poisons its residual and, through a NaN sum of squares, every
// output of its row; a thread that failed does no more polls (the team is aborted).
template <int kRanks>
__global__ void __launch_bounds__(kArNormMaxThreads) two_shot_ar_norm_kernel(const TwoShotNormParams np) {
  using namespace lamport;
  const TwoShotParams& p = np.base;
  __shared__ rownorm::RowSumAsync shared;
  __shared__ uint32_t entry;
  rownorm::ArNormRow<> epi{np.norm, p.width, &shared};
  rownorm::cluster_start(epi);
  const int row_frags = p.width / 8;
  const int owner_frags = row_frags / kRanks;
  const int frags_per_cta = p.width / (8 * kArNormCtas);
  const bool active = static_cast<int>(threadIdx.x) < frags_per_cta;
  const int frag = static_cast<int>(blockIdx.x) * frags_per_cta + static_cast<int>(threadIdx.x);
  const int own_chunk = active ? two_shot_own_chunk(p.team.rank, frag, owner_frags) : -1;
  const int first_row = static_cast<int>(blockIdx.y);
  const int row_step = static_cast<int>(gridDim.y);
  // Why before the wait: the weight is a parameter, not an output of the previous kernel.
  epi.load_params(frag, active);
  uint32_t epoch = 0;
  const Fragment* x = static_cast<const Fragment*>(p.x);
  Fragment head{};  // the first row's fragment
  const auto [entered, reduce, collect] = start_call(p, entry, &epoch, [&] {
    if (active && first_row < p.rows) head = x[first_row * row_frags + frag];
  });
  Memory mem(p.team.timeout_ns);
  bool ok = entered;
  if (active && ok)
    for (int row = first_row; row < p.rows; row += row_step)
      two_shot_push(mem, p.team, p.recv, reduce, row, frag, owner_frags,
                    row == first_row ? head : x[row * row_frags + frag]);
  const uint32_t ticket = threadIdx.x == 0 && entered ? take_ticket(mem, p.team, p.recv) : 0u;
  if (own_chunk >= 0)
    for (int row = first_row; ok && row < p.rows; row += row_step)
      ok = two_shot_reduce<kRanks>(mem, p.team, p.recv, p.gather, reduce, row, own_chunk, owner_frags);
  two_shot_gather_phase(mem, p.team);
  for (int row = first_row; row < p.rows; row += row_step) {
    const long at = static_cast<long>(row) * row_frags + frag;  // fragment index in [rows, width]
    epi.load_inputs(row, at, active);
    Fragment sum{};  // the reduced row's fragment (zeros in threads without one)
    if (active && ok) ok = two_shot_collect(mem, p.team, p.gather, collect, row, frag, owner_frags, &sum);
    epi.finish(sum, ok, row, at, frag, active, rownorm::NoHook{});  // its ticket is taken above
    if (row + row_step < p.rows) rownorm::cluster_arrive_next_row();
  }
  if (threadIdx.x == 0 && entered) advance_if_last(mem, p.team, p.recv, epoch, ticket, gridDim.x * gridDim.y);
  if (!p.trigger_early) dev::pdl_launch_dependents();
}

template <int kRanks>
const void* norm_symbol() {
  return reinterpret_cast<const void*>(&two_shot_ar_norm_kernel<kRanks>);
}

}  // namespace

void launch_two_shot_all_reduce(const RankContext& ctx, cudaStream_t stream, const TwoShotParams& p, int max_ctas) {
  const int wanted = (p.rows * (p.width / 8) + kThreads - 1) / kThreads;
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(std::clamp(wanted, 1, std::max(1, max_ctas))));
  s.block = dim3(kThreads);
  s.pdl = ctx.pdl;
  with_rank_count(ctx.size,
                  [&](auto ranks) { launch_kernel(two_shot_all_reduce_kernel<decltype(ranks)::value>, s, stream, p); });
}

void launch_two_shot_ar_norm(const RankContext& ctx, cudaStream_t stream, const TwoShotNormParams& p,
                             int max_clusters) {
  LaunchShape s;
  s.grid = dim3(kArNormCtas, static_cast<unsigned>(std::clamp(p.base.rows, 1, std::max(1, max_clusters))));
  s.block = dim3(static_cast<unsigned>(ar_norm_threads(p.base.width)));
  s.cluster = kArNormCtas;
  s.pdl = ctx.pdl;
  with_rank_count(ctx.size,
                  [&](auto ranks) { launch_kernel(two_shot_ar_norm_kernel<decltype(ranks)::value>, s, stream, p); });
}

int two_shot_all_reduce_budget(const RankContext& ctx) {
  return with_rank_count(ctx.size, [&](auto ranks) {
    return coresident_ctas_per_rank(
        ctx, reinterpret_cast<const void*>(&two_shot_all_reduce_kernel<decltype(ranks)::value>), kThreads, 0);
  });
}

int two_shot_ar_norm_budget(const RankContext& ctx, int64_t hidden) {
  return with_rank_count(ctx.size, [&](auto ranks) {
    return coresident_ctas_per_rank(ctx, norm_symbol<decltype(ranks)::value>(), ar_norm_threads(hidden), 0,
                                    kArNormCtas) /
           kArNormCtas;
  });
}

}  // namespace tpdecode
