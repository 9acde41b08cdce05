#include "comm/all_reduce.cuh"
#include "core/launch.cuh"
#include "core/rank_switch.hpp"

namespace tpdecode {

void launch_all_reduce(const RankContext& ctx, const AllReduceParams& p, int rows) {
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>((p.frags + kAllReduceThreads - 1) / kAllReduceThreads), static_cast<unsigned>(rows));
  s.block = dim3(kAllReduceThreads);
  s.pdl = ctx.pdl;
  with_rank_count(ctx.size, [&](auto ranks) {
    constexpr int kRanks = decltype(ranks)::value;
    require_coresident(ctx, "all_reduce", reinterpret_cast<const void*>(&all_reduce_kernel<kRanks>),
                       static_cast<long>(s.grid.x) * s.grid.y, kAllReduceThreads, 0);
    launch_kernel(all_reduce_kernel<kRanks>, s, ctx.stream, p);
  });
}

}  // namespace tpdecode
