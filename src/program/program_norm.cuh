// The GEMM program's RMSNorm op, run by the finisher warps of every CTA on its
// share of the k columns (protocol::norm_share), in this order:
//  1. each thread loads its pieces (8 columns of one token) of x (polled from the
//     mailbox where x is an earlier op's out, else the input) and the residual; with
//     all_reduce, x is first summed over the team (program_team.hpp); h = x, or
//     bf16(x + residual), stored to residual_out where asked (the weight is loaded
//     during step 3's round trip);
//  2. the share's sum of squares per token: per piece an fma chain over its 8
//     values from 0, the pieces added in column order; stored into the norm's stats
//     (mailbox words that start empty, so each shows its own arrival);
//  3. every CTA's sums polled and added: per 4 CTAs in CTA order, then those sums in
//     order (reference/program_norm.hpp follows this, bit for bit);
//  4. rstd = 1 / sqrt(sum / k + eps) (correctly rounded) and out = bf16((h * rstd) *
//     weight), stored and published; the finisher's thread 0 counts the CTA's share.
// Shared memory: the finisher's `pre`, once the consumers have taken its last sum.
#pragma once

#include <cuda/atomic>
#include <cuda_bf16.h>

#include <cstdint>

#include "core/device.cuh"
#include "program/program_activations.cuh"
#include "program/program_fold.cuh"
#include "program/program_launch.hpp"
#include "program/program_protocol.hpp"
#include "program/program_team.hpp"

namespace tpdecode::program {

__device__ __forceinline__ uint4 load16(const void* base, int64_t element) {
  return *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + element);
}
__device__ __forceinline__ void store16(void* base, int64_t element, const uint4& v) {
  *reinterpret_cast<uint4*>(static_cast<uint16_t*>(base) + element) = v;
}

// The 8 BF16 values of a piece as floats, and back.
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = __bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i])) |
           static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i + 1]))) << 16;
  return uint4{w[0], w[1], w[2], w[3]};
}

// A 16-byte piece as mailbox words (a word equal to kEmptyWord stored as another NaN).
__device__ __forceinline__ uint4 publishable(uint4 v) {
  auto fix = [](uint32_t w) { return w == kEmptyWord ? 0x7fff7fffu : w; };
  return uint4{fix(v.x), fix(v.y), fix(v.z), fix(v.w)};
}

// kTeam: the kernel of a program with team ops (norms that all-reduce their x);
// without it the team's sum is not compiled in (with it, the kernels' registers
// spill: 480-byte stack frames against 40 without).
template <int kFinisherThreads, bool kTeam>
struct NormShare {
  static constexpr int kItems = static_cast<int>(kNormMaxItems) / kFinisherThreads;  // pieces a thread holds
  static constexpr int kBatch = 4;  // 16-byte loads in flight per thread while polling the stats

  const Args& a;
  const OpDesc& op;
  float* smem;   // the handoff's pre: m * pieces floats, then m * (stats_stride / 4 + 1)
  uint32_t* box; // this run's mailbox epoch
  int thread;    // of the finisher's threads

  __device__ void sync() const { dev::named_barrier_sync(kNormBarrier, kFinisherThreads); }

  // x summed over the team: this share's pieces (token e / pieces, piece first + e %
  // pieces) pushed to every rank, then every rank's polled and summed in rank order
  // (program_team.hpp). Not inlined, as run().
  template <int kRanks>
  __device__ __noinline__ void team_sum(uint4 (&x)[kItems], int64_t first, int pieces) const {
    lamport::Memory mem(a.team.timeout_ns);
    const uint32_t parity = team::run_parity(mem, a.team, a.team_box);
    const int items = a.m * pieces;
    auto fragment = [&](int e) { return op.team_fragment + first + e % pieces; };
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int e = thread + kFinisherThreads * i;
      if (e >= items) continue;
      if (parity == lamport::kAbortedEntry) {
        x[i] = as_uint4(lamport::poisoned());
        continue;
      }
      team::push_piece<kRanks>(mem, a.team, a.team_box, parity, e / pieces, fragment(e), as_fragment(x[i]));
    }
    if (parity == lamport::kAbortedEntry) return;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int e = thread + kFinisherThreads * i;
      if (e < items)
        x[i] = as_uint4(team::reduce_piece<kRanks>(mem, a.team, a.team_box, parity, e / pieces, fragment(e)));
    }
  }
  __device__ void team_sum(uint4 (&x)[kItems], int64_t first, int pieces) const {
    switch (a.team.size) {
      case 1: return team_sum<1>(x, first, pieces);
      case 2: return team_sum<2>(x, first, pieces);
      case 4: return team_sum<4>(x, first, pieces);
      case 8: return team_sum<8>(x, first, pieces);
      default: return team_sum<16>(x, first, pieces);  // the host builds teams of these sizes only
    }
  }
  static __device__ __forceinline__ lamport::Fragment as_fragment(const uint4& v) {
    return lamport::Fragment{{v.x, v.y, v.z, v.w}};
  }
  static __device__ __forceinline__ uint4 as_uint4(const lamport::Fragment& f) {
    return uint4{f.w[0], f.w[1], f.w[2], f.w[3]};
  }

  // Not inlined: its registers stay out of the kernel's other roles (inlined, the
  // 64-token kernel spilled).
  __device__ __noinline__ void run(int index) const {  // op == a.ops[index]
    const protocol::Range share = protocol::norm_share(op.k, blockIdx.x, gridDim.x);
    const int pieces = static_cast<int>(share.end - share.begin);
    const int items = a.m * pieces;  // item e: token e / pieces, piece share.begin + e % pieces
    auto token = [&](int e) { return e / pieces; };
    auto column = [&](int e) { return (share.begin + e % pieces) * 8; };
    auto mine = [&](int i) { return thread + kFinisherThreads * i < items; };
    // A residual stream other CTAs stored in place (a folded norm's producer): its
    // count acquired before this share stores over it.
    if (op.residual_after_op >= 0) {
      if (thread == 0) wait_complete(a, op.residual_after_op);
      sync();
    }
    // 1. x and the residual.
    uint4 h[kItems], r[kItems];
    const bool polls = op.after >= 0;
    const bool residual = op.residual != nullptr || op.residual_mailbox >= 0;
    auto polled_residual = [&](int i) {
      const int e = thread + kFinisherThreads * i;
      return reinterpret_cast<const uint16_t*>(box) +
             protocol::mailbox_element(op.residual_mailbox, op.residual_mailbox_stride, token(e), column(e));
    };
    auto polled = [&](int i) {
      const int e = thread + kFinisherThreads * i;
      return reinterpret_cast<const uint16_t*>(box) +
             protocol::mailbox_element(op.x_mailbox, op.x_stride, token(e), column(e));
    };
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (!mine(i)) continue;
      const int e = thread + kFinisherThreads * i;
      h[i] = polls ? load_relaxed16(polled(i)) : load16(op.x_input, token(e) * op.x_input_stride + column(e));
      if (op.residual != nullptr) r[i] = load16(op.residual, token(e) * op.residual_stride + column(e));
      else if (op.residual_mailbox >= 0) r[i] = load_relaxed16(polled_residual(i));
    }
    if (polls) poll_until_published(h, mine, polled);
    if constexpr (kTeam)
      if (op.all_reduce != 0) team_sum(h, share.begin, pieces);
    if (op.residual_mailbox >= 0) poll_until_published(r, mine, polled_residual);
    // 2. h, its pieces' sums of squares, the share's per token.
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (!mine(i)) continue;
      const int e = thread + kFinisherThreads * i;
      float v[8];
      unpack8(h[i], v);
      if (residual) {
        float rv[8];
        unpack8(r[i], rv);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = __fadd_rn(v[j], rv[j]);
        h[i] = pack8(v);
        unpack8(h[i], v);
      }
      if (op.residual_out != nullptr) store16(op.residual_out, token(e) * op.residual_out_stride + column(e), h[i]);
      float sq = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) sq = __fmaf_rn(v[j], v[j], sq);
      smem[e] = sq;
    }
    sync();
    const int64_t stride = op.stats_stride;
    if (thread < a.m) {
      float partial = 0.0f;
      for (int q = 0; q < pieces; ++q) partial = __fadd_rn(partial, smem[thread * pieces + q]);
      const uint32_t bits = __float_as_uint(partial);
      store_relaxed(box + protocol::stats_word(op.stats, stride, thread, blockIdx.x),
                    bits == kEmptyWord ? 0x7fffffffu : bits);
    }
    if (blockIdx.x == 0)  // the words past the CTAs: zeros
      for (int e = thread; e < a.m * (stride - gridDim.x); e += kFinisherThreads)
        store_relaxed(box + protocol::stats_word(op.stats, stride, e / (stride - gridDim.x),
                                                 gridDim.x + e % (stride - gridDim.x)),
                      0u);
    sync();  // smem's sums read
    // The weight, on its way during the stats' round trip.
    uint4 w[kItems];
#pragma unroll
    for (int i = 0; i < kItems; ++i)
      if (mine(i)) w[i] = load16(op.norm_weight, column(thread + kFinisherThreads * i));
    // 3. Every CTA's sums: per token, stride / 4 pieces of 4 CTAs, each summed in order.
    const int groups = static_cast<int>(stride / 4);
    const int loads = a.m * groups;  // load f: token f / groups, CTAs 4 (f % groups) ..
    const uint32_t* stats = box + protocol::stats_word(op.stats, stride, 0, 0);
    for (int first = thread; first < loads; first += kFinisherThreads * kBatch) {
      uint4 v[kBatch];
      auto live = [&](int j) { return first + kFinisherThreads * j < loads; };
      auto at = [&](int j) {
        const int f = first + kFinisherThreads * j;
        return stats + (f / groups) * stride + 4 * (f % groups);
      };
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (live(j)) v[j] = load_relaxed16(at(j));
      poll_until_published(v, live, at);
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (live(j))
          smem[first + kFinisherThreads * j] =
              __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(0.0f, __uint_as_float(v[j].x)), __uint_as_float(v[j].y)),
                                  __uint_as_float(v[j].z)),
                        __uint_as_float(v[j].w));
    }
    sync();
    float* rstd = smem + loads;
    if (thread < a.m) {
      float total = 0.0f;
      for (int g = 0; g < groups; ++g) total = __fadd_rn(total, smem[thread * groups + g]);
      rstd[thread] = __frsqrt_rn(__fadd_rn(__fdiv_rn(total, static_cast<float>(op.k)), op.eps));
    }
    sync();
    // 4. The normalised pieces, stored and published.
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (!mine(i)) continue;
      const int e = thread + kFinisherThreads * i;
      const int t = token(e);
      const int64_t c = column(e);
      float v[8], g[8];
      unpack8(h[i], v);
      unpack8(w[i], g);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = __fmul_rn(__fmul_rn(v[j], rstd[t]), g[j]);
      const uint4 out = pack8(v);
      store16(op.out, t * op.out_stride + c, out);
      if (op.out_mailbox >= 0)
        store_relaxed16(reinterpret_cast<uint16_t*>(box) +
                            protocol::mailbox_element(op.out_mailbox, op.out_mailbox_stride, t, c),
                        publishable(out));
    }
    // The share's stores before the count (a released count's release is cumulative
    // over what the barrier ordered), and every read of rstd before the finisher
    // fills pre again.
    sync();
    if (thread == 0 && op.out_mailbox >= 0) count_published(a, index);
  }
};

}  // namespace tpdecode::program
