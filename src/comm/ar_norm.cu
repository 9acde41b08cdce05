#include "comm/ar_norm.cuh"
#include "core/launch.cuh"
#include "core/rank_switch.hpp"

namespace tpdecode {

namespace {

template <int kRanks>
const void* ar_norm_symbol() {
  return reinterpret_cast<const void*>(&ar_norm_kernel<kRanks>);
}

}  // namespace

int ar_norm_resident_rows(const RankContext& ctx, int hidden) {
  return with_rank_count(ctx.size, [&](auto ranks) {
    const int ctas = coresident_ctas_per_rank(ctx, ar_norm_symbol<decltype(ranks)::value>(), ar_norm_threads(hidden),
                                              0, kArNormCtas);
    return ctas / kArNormCtas;
  });
}

void launch_ar_norm(const RankContext& ctx, const ArNormParams& p, int rows) {
  LaunchShape s;
  s.grid = dim3(kArNormCtas, static_cast<unsigned>(rows));
  s.block = dim3(static_cast<unsigned>(ar_norm_threads(p.hidden)));
  s.cluster = kArNormCtas;
  s.pdl = ctx.pdl;
  with_rank_count(ctx.size, [&](auto ranks) {
    constexpr int kRanks = decltype(ranks)::value;
    require_coresident(ctx, "ar_norm", ar_norm_symbol<kRanks>(), static_cast<long>(kArNormCtas) * rows,
                       static_cast<int>(s.block.x), 0, kArNormCtas);
    launch_kernel(ar_norm_kernel<kRanks>, s, ctx.stream, p);
  });
}

}  // namespace tpdecode
