// The o-projection's producer and consumer kernels (oproj_roles.cuh has the roles),
// the AttnRes kernel of the unfused path, their launchers and budgets.
//
// Two-shot: the producer pushes each fragment to its column's owner only; the
// two-shot consumer (oproj_roles.cuh) reduces the owned columns, broadcasts them and
// gathers its rows; it waits for the producer like the local team's consumer.
//
// Producer + consumer, on one rank's stream: the producer (grid (split, H / 64),
// clusters of `split`) pushes its GEMM outputs; the consumer (grid (8, rows),
// clusters of 8) polls them. With one rank per GPU the producer lets the consumer
// launch once every producer CTA is past griddepcontrol.wait, and the consumer
// polls while the GEMM streams the weight (row_collective.cuh: `early`). No
// deadlock: a producer waits on nothing a consumer does, and the consumer's grid
// launches only once the producer's whole grid is resident. Where ranks share a GPU
// the consumer launches after the producer completed (the local team: a spinning
// consumer must not hold SMs a peer's producer needs), and its grid is held to the
// co-residency budget as ArNorm's is.
#include <algorithm>

#include "core/launch.cuh"
#include "core/rank_switch.hpp"
#include "oproj/oproj_roles.cuh"

namespace tpdecode {
namespace {

using lamport::Fragment;
using oproj::with_epilogue;
using oproj::with_ranks;

template <int kTiles, int kRanks>
__global__ void __launch_bounds__(warp_splitk::kThreads) oproj_producer_kernel(const OprojParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const warp_splitk::Slot s{static_cast<int64_t>(blockIdx.y), static_cast<int>(blockIdx.x),
                            static_cast<int>(gridDim.x), 0};
  oproj::produce<kTiles, kRanks>(p, s, smem, false);
}

template <int kRanks, OprojEpilogue kEpilogue>
__global__ void __launch_bounds__(kArNormMaxThreads) oproj_consumer_kernel(const OprojParams p) {
  oproj::consume<kRanks, kEpilogue>(p, static_cast<int>(blockIdx.y), p.trigger_early);
}

template <int kRanks, OprojEpilogue kEpilogue>
__global__ void __launch_bounds__(kArNormMaxThreads) oproj_two_shot_consumer_kernel(const OprojParams p) {
  oproj::consume_two_shot<kRanks, kEpilogue>(p);
}

// The unfused path's last kernel: the epilogue on rows already reduced.
__global__ void __launch_bounds__(kArNormMaxThreads) attn_res_kernel(const AttnResTail t, const Fragment* y,
                                                                     int hidden) {
  __shared__ attnres::Shared shared;
  rownorm::cluster_arrive_started();
  const int row = static_cast<int>(blockIdx.y);
  const int frags_per_cta = hidden / (8 * kArNormCtas);
  const bool active = static_cast<int>(threadIdx.x) < frags_per_cta;
  const int frag = static_cast<int>(blockIdx.x) * frags_per_cta + static_cast<int>(threadIdx.x);
  const long at = static_cast<long>(row) * (hidden / 8) + frag;
  attnres::Row epi{t, hidden, &shared};
  epi.load_params(frag, active);
  dev::pdl_launch_dependents();
  dev::pdl_wait();
  epi.load_inputs(row, at, active);
  const Fragment sum = active ? y[at] : Fragment{};
  epi.finish(sum, true, row, at, frag, active, rownorm::NoHook{});
}

template <int kRanks, OprojEpilogue kEpilogue>
const void* consumer_symbol() {
  return reinterpret_cast<const void*>(&oproj_consumer_kernel<kRanks, kEpilogue>);
}

}  // namespace

void launch_oproj_producer(const RankContext& ctx, cudaStream_t stream, const OprojParams& p) {
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(p.split), static_cast<unsigned>(p.gemm.n / kWarpCtaRows));
  s.block = dim3(warp_splitk::kThreads);
  s.smem = static_cast<std::size_t>(warp_smem_bytes(p.token_tiles));
  s.cluster = p.split;
  s.pdl = ctx.pdl;
  with_ranks(ctx.size, [&](auto ranks) {
    with_token_tiles(p.token_tiles, [&](auto tiles) {
      launch_kernel(oproj_producer_kernel<decltype(tiles)::value, decltype(ranks)::value>, s, stream, p);
    });
  });
}

void launch_oproj_consumer(const RankContext& ctx, cudaStream_t stream, const OprojParams& p, int two_shot_clusters) {
  LaunchShape s;
  // Why fewer clusters for the two-shot: they loop over rows, within the budget.
  const int clusters = p.two_shot ? std::max(1, std::min(p.gemm.m, two_shot_clusters)) : p.gemm.m;
  s.grid = dim3(kArNormCtas, static_cast<unsigned>(clusters));
  s.block = dim3(static_cast<unsigned>(ar_norm_threads(p.hidden)));
  s.cluster = kArNormCtas;
  s.pdl = ctx.pdl;
  with_ranks(ctx.size, [&](auto ranks) {
    with_epilogue(p.epilogue, [&](auto epi) {
      constexpr int kRanks = decltype(ranks)::value;
      constexpr OprojEpilogue kEpi = decltype(epi)::value;
      if (p.two_shot)
        launch_kernel(oproj_two_shot_consumer_kernel<kRanks, kEpi>, s, stream, p);
      else
        launch_kernel(oproj_consumer_kernel<kRanks, kEpi>, s, stream, p);
    });
  });
}

void launch_attn_res(cudaStream_t stream, bool pdl, const void* y, const AttnResTail& t, int rows, int hidden) {
  LaunchShape s;
  s.grid = dim3(kArNormCtas, static_cast<unsigned>(rows));
  s.block = dim3(static_cast<unsigned>(ar_norm_threads(hidden)));
  s.cluster = kArNormCtas;
  s.pdl = pdl;
  launch_kernel(attn_res_kernel, s, stream, t, static_cast<const Fragment*>(y), hidden);
}

void prepare_oproj_producer(int team_size, int tiles) {
  with_ranks(team_size, [&](auto ranks) {
    with_token_tiles(tiles, [&](auto t) {
      TPD_CUDA(cudaFuncSetAttribute(oproj_producer_kernel<decltype(t)::value, decltype(ranks)::value>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, warp_smem_bytes(tiles)));
    });
  });
}

int oproj_consumer_rows(const RankContext& ctx, OprojEpilogue epilogue, int64_t hidden) {
  return with_ranks(ctx.size, [&](auto ranks) {
    return with_epilogue(epilogue, [&](auto epi) {
      const void* symbol = consumer_symbol<decltype(ranks)::value, decltype(epi)::value>();
      return coresident_ctas_per_rank(ctx, symbol, ar_norm_threads(hidden), 0, kArNormCtas) / kArNormCtas;
    });
  });
}

int oproj_two_shot_clusters(const RankContext& ctx, OprojEpilogue epilogue, int64_t hidden) {
  return with_ranks(ctx.size, [&](auto ranks) {
    return with_epilogue(epilogue, [&](auto epi) {
      const void* symbol = reinterpret_cast<const void*>(
          &oproj_two_shot_consumer_kernel<decltype(ranks)::value, decltype(epi)::value>);
      return coresident_ctas_per_rank(ctx, symbol, ar_norm_threads(hidden), 0, kArNormCtas) / kArNormCtas;
    });
  });
}

}  // namespace tpdecode
