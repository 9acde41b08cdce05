// The gather kernel: grid (CTAs per row, rows). A thread pushes its share of the
// row's shard fragments to every rank, then polls its share of the gathered row in
// its own mailbox, copies it out and re-arms it (collectives.hpp). All pushes of a
// thread precede its polls.
#include <algorithm>

#include "comm/collectives.hpp"
#include "comm/kernels.hpp"
#include "core/device.cuh"
#include "core/launch.cuh"
#include "core/rank_switch.hpp"

namespace tpdecode {
namespace {

constexpr int kThreads = 256;
// Why: about one fragment per thread, at most 32 CTAs per row, and at most ~1.5
// waves of one CTA per SM (192) over all rows of all the ranks on one GPU.
constexpr int kMaxCtasPerRow = 32;
constexpr int kCtaBudget = 192;

template <int kRanks>
__global__ void __launch_bounds__(kThreads) gather_kernel(const GatherParams p) {
  using namespace lamport;
  __shared__ uint32_t entry;
  const int row = blockIdx.y;
  const int first = blockIdx.x * kThreads + threadIdx.x;
  const int step = gridDim.x * kThreads;
  const int row_frags = p.shard_frags * kRanks;
  Fragment* out = static_cast<Fragment*>(p.out) + static_cast<long>(row) * row_frags;
  if (p.trigger_early) dev::pdl_launch_dependents();
  dev::pdl_wait();
  const Fragment* shard = static_cast<const Fragment*>(p.shard) + static_cast<long>(row) * p.shard_frags;
  // Why before the entry: the first shard fragment's load and the entry's round trip overlap.
  const Fragment head = first < p.shard_frags ? shard[first] : Fragment{};
  Memory mem(p.team.timeout_ns);
  uint32_t epoch = 0;
  if (threadIdx.x == 0) entry = begin(mem, p.team, p.box, Op::kGather, &epoch);
  __syncthreads();
  bool ok = entry != kAbortedEntry;
  const Call call{Op::kGather, static_cast<int>(entry)};
  if (ok) {
    // Why the head apart: a select between it and a load sends it through local memory,
    // serializing its load with the entry's.
    if (first < p.shard_frags) gather_push<kRanks>(mem, p.team, p.box, call, row, first, p.shard_frags, head);
    for (int f = first + step; f < p.shard_frags; f += step)
      gather_push<kRanks>(mem, p.team, p.box, call, row, f, p.shard_frags, shard[f]);
  }
  const uint32_t ticket = threadIdx.x == 0 && ok ? take_ticket(mem, p.team, p.box) : 0u;
  for (int f = first; f < row_frags; f += step) {
    Fragment got = poisoned();
    if (ok) ok = gather_collect(mem, p.team, p.box, call, row, f, p.shard_frags, &got);
    out[f] = ok ? got : poisoned();
  }
  if (threadIdx.x == 0 && entry != kAbortedEntry)
    advance_if_last(mem, p.team, p.box, epoch, ticket, gridDim.x * gridDim.y);
  if (!p.trigger_early) dev::pdl_launch_dependents();
}

int ctas_per_row(int rows, int64_t row_frags, int ranks_on_device) {
  const int64_t want = (row_frags + kThreads - 1) / kThreads;
  const int64_t budget = kCtaBudget / std::max<int64_t>(1, static_cast<int64_t>(rows) * std::max(1, ranks_on_device));
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({want, kMaxCtasPerRow, budget})));
}

}  // namespace

void launch_gather(const RankContext& ctx, cudaStream_t stream, const GatherParams& p, int rows) {
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(ctas_per_row(rows, static_cast<int64_t>(p.shard_frags) * ctx.size,
                                                   ctx.ranks_on_device)),
                static_cast<unsigned>(rows));
  s.block = dim3(kThreads);
  s.pdl = ctx.pdl;
  with_rank_count(ctx.size, [&](auto ranks) { launch_kernel(gather_kernel<decltype(ranks)::value>, s, stream, p); });
}

int gather_resident_rows(const RankContext& ctx) {
  return with_rank_count(ctx.size, [&](auto ranks) {
    return coresident_ctas_per_rank(ctx, reinterpret_cast<const void*>(&gather_kernel<decltype(ranks)::value>),
                                    kThreads, 0);
  });
}

}  // namespace tpdecode
