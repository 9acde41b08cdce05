#include "comm/gather.cuh"
#include "core/launch.cuh"
#include "core/rank_switch.hpp"

namespace tpdecode {

namespace {

template <int kRanks>
const void* gather_symbol() {
  return reinterpret_cast<const void*>(&gather_kernel<kRanks>);
}

}  // namespace

int gather_ctas_per_rank(const RankContext& ctx) {
  return with_rank_count(ctx.size, [&](auto ranks) {
    return coresident_ctas_per_rank(ctx, gather_symbol<decltype(ranks)::value>(), kGatherThreads, 0);
  });
}

void launch_gather(const RankContext& ctx, const GatherParams& p, int rows) {
  LaunchShape s;
  const int64_t frags_per_row = static_cast<int64_t>(p.shard_frags) * ctx.size;
  s.grid = dim3(static_cast<unsigned>(gather_ctas(rows, frags_per_row, ctx.ranks_on_device)),
                static_cast<unsigned>(rows));
  s.block = dim3(kGatherThreads);
  s.pdl = ctx.pdl;
  with_rank_count(ctx.size, [&](auto ranks) {
    constexpr int kRanks = decltype(ranks)::value;
    require_coresident(ctx, "gather", gather_symbol<kRanks>(), static_cast<long>(s.grid.x) * s.grid.y,
                       kGatherThreads, 0);
    launch_kernel(gather_kernel<kRanks>, s, ctx.stream, p);
  });
}

}  // namespace tpdecode
