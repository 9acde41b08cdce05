// The fused o-projection kernel: both roles (oproj_roles.cuh) in one grid of
// 8-CTA clusters, warp_splitk::kThreads threads per CTA.
//  - Clusters 0 .. P/8 - 1 produce: CTA q = 8 · cluster + rank takes block q / split
//    of the GEMM's H / 64 output blocks, K part q % split; a block's split CTAs are
//    consecutive ranks of one cluster (8 % split == 0), which reduce through its
//    distributed shared memory as in the engine's own kernel: the same partials,
//    bit for bit, as the producer kernel at the same split.
//  - The next `rows` clusters consume, one row each: ArNorm's geometry with
//    kThreads threads (threads past H / 64 hold nothing and add zeros to the row
//    sums, which changes no bit of them).
// Deadlock-free by construction: producers never wait on consumers, and the whole
// grid of every rank on a GPU is resident at once (the host checks the budget,
// oproj_fused_budget, and refuses above it), so every push a consumer polls for is
// made by a running or finished CTA. Every CTA takes an epoch ticket; the last
// advances the epoch. Shared memory: the engine's ring in every CTA (the launch is
// uniform), the consumer's row sums beside it.
#include "core/launch.cuh"
#include "oproj/oproj_roles.cuh"

namespace tpdecode {
namespace {

using oproj::with_epilogue;
using oproj::with_ranks;

// Producer CTAs of the grid: every 64-row block times its K split.
int producer_ctas(const OprojParams& p) { return static_cast<int>(p.gemm.n / kWarpCtaRows) * p.split; }

template <int kTiles, int kRanks, OprojEpilogue kEpilogue>
__global__ void __launch_bounds__(warp_splitk::kThreads) oproj_fused_kernel(const OprojParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int producer_clusters = static_cast<int>(p.gemm.n / kWarpCtaRows) * p.split / kArNormCtas;
  const int cluster = static_cast<int>(blockIdx.y);
  if (cluster < producer_clusters) {
    const int q = cluster * kArNormCtas + static_cast<int>(blockIdx.x);
    const warp_splitk::Slot s{q / p.split, q % p.split, p.split, static_cast<int>(blockIdx.x) / p.split * p.split};
    oproj::produce<kTiles, kRanks>(p, s, smem, true);
  } else {
    oproj::consume<kRanks, kEpilogue>(p, cluster - producer_clusters, false);
  }
}

// The fused kernel of (team size, tiles, epilogue): built for at most
// kOprojFusedMaxTiles token tiles (its consumers need 8 CTAs per row to be resident
// beside the producers: more rows do not fit).
template <class F>
decltype(auto) with_kernel(int team_size, int tiles, OprojEpilogue epilogue, F&& f) {
  return with_ranks(team_size, [&](auto ranks) {
    return with_epilogue(epilogue, [&](auto epi) {
      constexpr int kRanks = decltype(ranks)::value;
      constexpr OprojEpilogue kEpi = decltype(epi)::value;
      static_assert(kOprojFusedMaxTiles == 2, "the switch below");
      switch (tiles) {
        case 1: return f(oproj_fused_kernel<1, kRanks, kEpi>);
        case 2: return f(oproj_fused_kernel<2, kRanks, kEpi>);
        default: throw InvalidArgument("oproj: the fused kernel takes at most 16 rows");
      }
    });
  });
}

}  // namespace

void prepare_oproj_fused(int team_size, int tiles, OprojEpilogue epilogue) {
  with_kernel(team_size, tiles, epilogue, [&](auto kernel) {
    TPD_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, warp_smem_bytes(tiles)));
  });
}

int oproj_fused_budget(const RankContext& ctx, OprojEpilogue epilogue, int tiles) {
  return with_kernel(ctx.size, tiles, epilogue, [&](auto kernel) {
    return coresident_ctas_per_rank(ctx, reinterpret_cast<const void*>(kernel), warp_splitk::kThreads,
                                    static_cast<std::size_t>(warp_smem_bytes(tiles)), kArNormCtas);
  });
}

int oproj_fused_ctas(const OprojParams& p) { return producer_ctas(p) + kArNormCtas * p.gemm.m; }

void launch_oproj_fused(const RankContext& ctx, cudaStream_t stream, const OprojParams& p) {
  LaunchShape s;
  s.grid = dim3(kArNormCtas, static_cast<unsigned>(oproj_fused_ctas(p) / kArNormCtas));
  s.block = dim3(warp_splitk::kThreads);
  s.smem = static_cast<std::size_t>(warp_smem_bytes(p.token_tiles));
  s.cluster = kArNormCtas;
  s.pdl = ctx.pdl;
  with_kernel(ctx.size, p.token_tiles, p.epilogue, [&](auto kernel) { launch_kernel(kernel, s, stream, p); });
}

}  // namespace tpdecode
