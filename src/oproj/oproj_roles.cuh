// The two roles of the o-projection's kernels (oproj.cu: one kernel each;
// oproj_fused.cu: both in one grid), written once.
//
// Producer: one CTA of the warp split-K engine (warp_splitk.cuh) whose epilogue
// rounds each FP32 output fragment (8 columns of one token) once to BF16 and pushes
// it, cleaned, into slot [rank] of every rank's mailbox (collectives.hpp's
// one_shot_push: TP peer stores, never multicast), or, two-shot, into slot [rank]
// of its column owner's recv mailbox only (two_shot_push). It never waits on a consumer:
// its only waits are griddepcontrol.wait and the GEMM's own pipeline. Entry
// (begin(): the abort word and the epoch) after griddepcontrol.wait, so no mailbox
// store precedes it; the parity is the consumers' (nothing changes the epoch
// between the two: only the call's consumers advance it, after every push).
//
// Consumer: ArNorm's row body (row_collective.cuh) without the push, with the
// epilogue of the call: rownorm::ArNormRow (ArNorm's own, so the same bits) or
// attnres::Row.
#pragma once

#include <type_traits>

#include "comm/row_collective.cuh"
#include "gemm/token_tiles.hpp"
#include "gemm/warp_splitk.cuh"
#include "oproj/attn_res.cuh"
#include "oproj/oproj_kernels.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::oproj {

using lamport::Fragment;

// Team sizes the kernels are built for (TP 1 has no mailbox); their token tiles are
// the warp engine's (gemm/token_tiles.hpp).
template <class F>
decltype(auto) with_ranks(int n, F&& f) {
  switch (n) {
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 16: return f(std::integral_constant<int, 16>{});
    default: throw InvalidArgument("oproj: team size " + std::to_string(n) + " has no kernels (2, 4, 8 or 16)");
  }
}
template <class F>
decltype(auto) with_epilogue(OprojEpilogue e, F&& f) {
  if (e == OprojEpilogue::kArNorm) return f(std::integral_constant<OprojEpilogue, OprojEpilogue::kArNorm>{});
  return f(std::integral_constant<OprojEpilogue, OprojEpilogue::kAttnRes>{});
}

// The producer role of one CTA. count_cta: the CTA takes an epoch ticket (the fused
// kernel, where every CTA counts; the producer kernel's consumer advances alone).
template <int kTiles, int kRanks>
__device__ __forceinline__ void produce(const OprojParams& p, const warp_splitk::Slot& s, uint8_t* smem,
                                        bool count_cta) {
  using namespace lamport;
  __shared__ uint32_t entry;
  Memory mem(p.team.timeout_ns);
  uint32_t epoch = 0;
  const MailboxRef& entry_box = p.two_shot ? p.recv : p.box;  // the call's epoch counter
  const int owner_frags = p.hidden / 8 / kRanks;
  warp_splitk::run_cta<kTiles, 8>(
      p.gemm, s, smem, p.gemm.m * 8, nullptr,
      [&] {
        // Why here: after griddepcontrol.wait (no mailbox store before it); the
        // round trip overlaps the activations' first copies. The barriers of the
        // main loop publish `entry` to the other threads.
        if (threadIdx.x == 0) entry = begin(mem, p.team, entry_box, Op::kOproj, &epoch);
        if (p.system_fence) dev::fence_acq_rel_sys();  // before this thread's first push
      },
      [&](int token, int64_t column, const float (&v)[8]) {
        // Why here, after the weights are streamed (a CTA without outputs counts at
        // its exit): consumers launched during the GEMM sat on its SMs, polling, for
        // all of it. After the wait, so the consumer may read its inputs and the
        // epoch without waiting (row_collective.cuh: `early`).
        if (p.trigger_early) dev::pdl_launch_dependents();
        if (entry == kAbortedEntry) return;
        Fragment f;
#pragma unroll
        for (int j = 0; j < 4; ++j) f.w[j] = bf16::pack_rounded(v[2 * j], v[2 * j + 1]);
        const Call call{Op::kOproj, static_cast<int>(entry)};
        if (p.two_shot)  // to the column's owner only
          two_shot_push(mem, p.team, p.recv, call, token, static_cast<int>(column / 8), owner_frags, f);
        else
          one_shot_push<kRanks>(mem, p.team, p.box, call, token, static_cast<int>(column / 8), f);
      });
  if (count_cta && threadIdx.x == 0 && entry != kAbortedEntry)
    advance_if_last(mem, p.team, entry_box, epoch, take_ticket(mem, p.team, entry_box), gridDim.x * gridDim.y);
}

// Calls f(epilogue): the call's row epilogue, its shared memory declared here.
template <OprojEpilogue kEpilogue, class F>
__device__ __forceinline__ void with_row_epilogue(const OprojParams& p, F&& f) {
  if constexpr (kEpilogue == OprojEpilogue::kArNorm) {
    __shared__ rownorm::RowSumAsync shared;
    // Why unquantised: the o-projection's epilogue writes BF16 (oproj.hpp).
    rownorm::ArNormRow<false> epi{p.ar_norm, p.hidden, &shared};
    f(epi);
  } else {
    __shared__ attnres::Shared shared;
    attnres::Row epi{p.attn_res, p.hidden, &shared};
    f(epi);
  }
}

// The consumer role of one CTA of row `row`'s cluster.
template <int kRanks, OprojEpilogue kEpilogue>
__device__ __forceinline__ void consume(const OprojParams& p, int row, bool early) {
  const RowCall call{p.team, p.box, lamport::Op::kOproj, nullptr, p.hidden, p.trigger_early, early, false};
  with_row_epilogue<kEpilogue>(p, [&](auto& epi) { row_collective<kRanks>(call, epi, row); });
}

// The two-shot consumer of one CTA: ArNorm's geometry, the cluster taking rows
// blockIdx.y, + gridDim.y, ... (every CTA of a cluster the same rows, so every
// thread reaches each row's cluster barriers). Owner sums first (the thread holding
// fragment rank·W/8 + k reduces this rank's owned chunk k of each row:
// collectives.hpp's two_shot_own_chunk and two_shot_reduce, which broadcasts the sum
// into every rank's gather row and re-arms), then per row the gather
// (two_shot_collect) and the epilogue. A
// reduction waits only on producer pushes, a gather only on reductions, and the
// clusters of every rank on a GPU are resident at once (the host's budget): no
// circular wait. The call's epoch is the recv mailbox's (the gather's is shared).
template <int kRanks, OprojEpilogue kEpilogue>
__device__ __forceinline__ void consume_two_shot(const OprojParams& p) {
  using namespace lamport;
  with_row_epilogue<kEpilogue>(p, [&](auto& epi) {
    __shared__ uint32_t entry;
    rownorm::cluster_start(epi);
    const int row_frags = p.hidden / 8;
    const int owner_frags = row_frags / kRanks;
    const int frags_per_cta = p.hidden / (8 * kArNormCtas);
    const bool active = static_cast<int>(threadIdx.x) < frags_per_cta;
    const int frag = static_cast<int>(blockIdx.x) * frags_per_cta + static_cast<int>(threadIdx.x);
    const int own_chunk = active ? two_shot_own_chunk(p.team.rank, frag, owner_frags) : -1;
    const int rows = p.gemm.m;
    const int first_row = static_cast<int>(blockIdx.y);
    const int row_step = static_cast<int>(gridDim.y);
    epi.load_params(frag, active);
    if (p.trigger_early) dev::pdl_launch_dependents();
    dev::pdl_wait();
    Memory mem(p.team.timeout_ns);
    uint32_t epoch = 0;
    if (threadIdx.x == 0) entry = begin(mem, p.team, p.recv, Op::kOproj, &epoch);
    __syncthreads();
    const bool entered = entry != kAbortedEntry;
    const Call call{Op::kOproj, static_cast<int>(entry)};
    const uint32_t ticket = threadIdx.x == 0 && entered ? take_ticket(mem, p.team, p.recv) : 0u;
    bool ok = entered;
    if (own_chunk >= 0)
      for (int row = first_row; ok && row < rows; row += row_step)
        ok = two_shot_reduce<kRanks>(mem, p.team, p.recv, p.gather, call, row, own_chunk, owner_frags);
    two_shot_gather_phase(mem, p.team);
    for (int row = first_row; row < rows; row += row_step) {
      const long at = static_cast<long>(row) * row_frags + frag;
      epi.load_inputs(row, at, active);
      Fragment sum{};
      if (active && ok) ok = two_shot_collect(mem, p.team, p.gather, call, row, frag, owner_frags, &sum);
      epi.finish(sum, ok, row, at, frag, active, rownorm::NoHook{});  // its ticket is taken above
      if (row + row_step < rows) rownorm::cluster_arrive_next_row();
    }
    if (threadIdx.x == 0 && entered) advance_if_last(mem, p.team, p.recv, epoch, ticket, gridDim.x * gridDim.y);
    if (!p.trigger_early) dev::pdl_launch_dependents();
  });
}

}  // namespace tpdecode::oproj
