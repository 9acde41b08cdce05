// The ArNorm kernel: one-shot all-reduce + residual add + RMSNorm of one row per
// 8-CTA cluster, CTA c owning columns [c·H/8, (c+1)·H/8), one 16-byte fragment
// (8 columns) per thread: row_collective.cuh's body (the all-reduce is
// collectives.hpp's one-shot) with row_norm.cuh's epilogue (its math and
// summation order).
// Programmatic dependent launch: the weight loads before griddepcontrol.wait, no
// mailbox store precedes it; dependents are triggered at once with one rank per
// GPU, after the polls when ranks share a GPU (why: all_reduce.cu).
#include "comm/row_collective.cuh"
#include "core/launch.cuh"
#include "core/rank_switch.hpp"

namespace tpdecode {
namespace {

template <int kRanks>
__global__ void __launch_bounds__(kArNormMaxThreads) ar_norm_kernel(const ArNormParams p) {
  __shared__ rownorm::RowSumAsync shared;
  rownorm::ArNormRow<> epi{p.norm, p.hidden, &shared};
  const RowCall call{p.team,       p.box, lamport::Op::kArNorm, p.x, p.hidden, p.trigger_early, false,
                     p.system_fence, p.clean_sum};
  row_collective<kRanks>(call, epi, static_cast<int>(blockIdx.y));
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
