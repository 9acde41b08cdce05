// The one-shot all-reduce kernel: one thread per 16-byte fragment (8 BF16
// columns), grid (fragment CTAs, rows). Every rank pushes its partial into slot
// [rank] of every rank's mailbox, polls its own TP slots, sums them in FP32 in rank
// order and rounds once (collectives.hpp), then re-arms its slots.
#include "comm/collectives.hpp"
#include "comm/kernels.hpp"
#include "comm/test_delays.cuh"
#include "core/device.cuh"
#include "core/launch.cuh"
#include "core/rank_switch.hpp"

namespace tpdecode {
namespace {

constexpr int kThreads = 128;

template <int kRanks>
__global__ void __launch_bounds__(kThreads) one_shot_kernel(const OneShotParams p) {
  using namespace lamport;
  __shared__ uint32_t entry;
  const int frag = blockIdx.x * kThreads + threadIdx.x;
  const int row = blockIdx.y;
  if (p.trigger_early) dev::pdl_launch_dependents();
  dev::pdl_wait();  // no mailbox store, and no read of x, before the previous kernel completed
  const long at = static_cast<long>(row) * p.frags + frag;
  // Why before the entry: the partial's load and the entry's round trip overlap.
  const Fragment mine = frag < p.frags ? static_cast<const Fragment*>(p.x)[at] : Fragment{};
  Memory mem(p.team.timeout_ns);
  uint32_t epoch = 0;
  if (threadIdx.x == 0) entry = begin(mem, p.team, p.box, Op::kAllReduce, &epoch);
  __syncthreads();
  if (frag >= p.frags) return;
  Fragment* out = static_cast<Fragment*>(p.out) + at;
  if (entry == kAbortedEntry) {
    *out = poisoned();
    return;
  }
  const Call call{Op::kAllReduce, static_cast<int>(entry)};
  test_delay(0);
  if (p.system_fence) dev::fence_acq_rel_sys();
  one_shot_push<kRanks>(mem, p.team, p.box, call, row, frag, mine);
  const uint32_t ticket = threadIdx.x == 0 ? take_ticket(mem, p.team, p.box) : 0u;
  test_delay(1);
  Fragment sum;
  const bool ok = one_shot_collect<kRanks>(mem, p.team, p.box, call, row, frag, &sum);
  if (threadIdx.x == 0) advance_if_last(mem, p.team, p.box, epoch, ticket, gridDim.x * gridDim.y);
  // Why late with several ranks on one GPU: a dependent grid launched early could
  // hold SM slots that a peer's grid of this call still needs; once this thread has
  // seen every peer's push, every peer's grid of this call is resident.
  if (!p.trigger_early) dev::pdl_launch_dependents();
  *out = !ok ? poisoned() : p.clean_sum ? clean(sum) : sum;
}

int ctas_per_row(int frags) { return (frags + kThreads - 1) / kThreads; }

}  // namespace

void launch_one_shot(const RankContext& ctx, cudaStream_t stream, const OneShotParams& p, int rows) {
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(ctas_per_row(p.frags)), static_cast<unsigned>(rows));
  s.block = dim3(kThreads);
  s.pdl = ctx.pdl;
  with_rank_count(ctx.size, [&](auto ranks) { launch_kernel(one_shot_kernel<decltype(ranks)::value>, s, stream, p); });
}

#if defined(TPDECODE_TEST_DELAYS)
void* test_delays_address() {
  void* p = nullptr;
  TPD_CUDA(cudaGetSymbolAddress(&p, g_test_delays));
  return p;
}
#endif

int one_shot_resident_rows(const RankContext& ctx, int64_t width) {
  return with_rank_count(ctx.size, [&](auto ranks) {
    const int ctas = coresident_ctas_per_rank(
        ctx, reinterpret_cast<const void*>(&one_shot_kernel<decltype(ranks)::value>), kThreads, 0);
    return ctas / ctas_per_row(static_cast<int>(width / 8));
  });
}

}  // namespace tpdecode
