#include "comm/all_reduce.cuh"

static_assert(tpdecode::kAllReduceThreads == 128, "all_reduce_ctas_per_row assumes 128 threads");
#include "core/launch.cuh"
#include "core/rank_switch.hpp"

namespace tpdecode {

int all_reduce_ctas_per_rank(const RankContext& ctx) {
  return with_rank_count(ctx.size, [&](auto ranks) {
    return coresident_ctas_per_rank(ctx, reinterpret_cast<const void*>(&all_reduce_kernel<decltype(ranks)::value>),
                                    kAllReduceThreads, 0);
  });
}

void launch_all_reduce(const RankContext& ctx, const AllReduceParams& p, int rows) {
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(all_reduce_ctas_per_row(p.frags)), static_cast<unsigned>(rows));
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
