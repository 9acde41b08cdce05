// The GEMM program's folded norms (GemmProgram::Norm::folded): a norm that no stage
// waits for. Its x's producer, a GEMM P, finishes each published block as
//  - h = its rounded sums, or with a residual bf16(sum + residual) (the residual an
//    input, or the rows an earlier folded norm's producer published), stored to
//    residual_out where asked and published instead of the sums;
//  - per token, the sum of squares of the block's 64 values of h (block_sums_of_
//    squares): per thread rows r and r + 8 (fma from the square of r), then the lanes
//    of a warp by xor-shuffles over 4, 8, 16, then the 4 warps in order; one word per
//    (token, block) in P's stats region, which starts empty like every mailbox word.
// A GEMM G reading the norm's out reads P's h through the mailbox with the norm's
// weight folded into its packed weight, and scales its FP32 sums by the row's rstd
// before its one rounding. The finisher computes rstd once per CTA and op (FoldedRstd,
// before G's first unit), from the blocks of the norm's window: per aligned group of
// 4 blocks the window's words added in block order, the groups then in order;
// rstd = 1 / sqrt(sum / k + eps) correctly rounded, as the norm op does.
#pragma once

#include <cuda/atomic>
#include <cuda_bf16.h>

#include <cstdint>

#include "core/device.cuh"
#include "program/program_activations.cuh"
#include "program/program_launch.hpp"
#include "program/program_protocol.hpp"

namespace tpdecode::program {

// The named barriers besides kFinishBarrier (1, the consumers' and the finisher's):
// the finisher warps' own (norm shares, prologues), the consumers' own (a block's
// row sums).
inline constexpr int kNormBarrier = 2;
inline constexpr int kRowSumsBarrier = 3;

// A residual value of a folded norm's producer, from the mailbox rows an earlier
// folded norm's producer published: polled until written (it was, long before, so
// the timer is read only once a load finds the word empty).
__device__ __forceinline__ float polled_bf16(const uint32_t* box, int64_t element) {
  const uint32_t* word = box + element / 2;
  auto load = [word] {
    uint32_t v;
    asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(word) : "memory");
    return v;
  };
  uint32_t v = load();
  if (v == kEmptyWord) {
    const uint64_t start = dev::global_timer_ns();
    while ((v = load()) == kEmptyWord)
      if (dev::global_timer_ns() - start > dev::kMbarTimeoutNs) __trap();
  }
  return __uint_as_float(element % 2 == 0 ? v << 16 : v & 0xffff0000u);
}

// Counts one published block (or a norm's share) of op `op`: with release where a
// reader acquires the count (counts_released), else relaxed.
__device__ __forceinline__ void count_published(const Args& a, int op) {
  cuda::atomic_ref<uint32_t, cuda::thread_scope_device> done(a.counters.op_done[op]);
  if (counts_released(a, op)) done.fetch_add(1, cuda::memory_order_release);
  else done.fetch_add(1, cuda::memory_order_relaxed);
}

// Waits until op `op`'s count is complete, with acquire (one thread; the op counts
// with release: OpDesc::count_release).
__device__ __forceinline__ void wait_complete(const Args& a, int op) {
  cuda::atomic_ref<uint32_t, cuda::thread_scope_device> done(a.counters.op_done[op]);
  const uint64_t start = dev::global_timer_ns();
  while (!protocol::complete(done.load(cuda::memory_order_acquire), a.ops[op].blocks))
    if (dev::global_timer_ns() - start > dev::kMbarTimeoutNs) __trap();
}

// The consumer warpgroup's per-token sums of squares of a block's values h (its
// registers as wgmma's fragment holds them; values past n and m are zero or
// unread), stored into P's stats; `buffer` ([2][4][kTokens] floats of shared
// memory) alternates between blocks so that a warp may start the next block's
// shuffles while the last block's sums are read.
template <int kTokens>
__device__ __forceinline__ void block_sums_of_squares(const Args& a, const OpDesc& op, uint32_t epoch, int block,
                                                      const float (&h)[kTokens / 2], float* buffer,
                                                      uint32_t& parity) {
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32;
  float* mine = buffer + parity * 4 * kTokens;
#pragma unroll
  for (int i = 0; i < kTokens / 2; i += 4)
#pragma unroll
    for (int d = 0; d < 2; ++d) {  // registers i + d (row r) and i + d + 2 (row r + 8): one token
      float s = __fmaf_rn(h[i + d + 2], h[i + d + 2], __fmul_rn(h[i + d], h[i + d]));
      s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 4));
      s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 8));
      s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 16));
      if (lane < 4) mine[warp * kTokens + wgmma::fragment_token(lane, i + d)] = s;
    }
  dev::named_barrier_sync(kRowSumsBarrier, wgmma::kConsumerThreads);
  if (tid < a.m) {
    const float s = __fadd_rn(__fadd_rn(__fadd_rn(mine[tid], mine[kTokens + tid]), mine[2 * kTokens + tid]),
                              mine[3 * kTokens + tid]);
    uint32_t* box = a.mailbox + epoch * a.epoch_words;
    const uint32_t bits = __float_as_uint(s);
    store_relaxed(box + protocol::stats_word(op.stats, op.stats_stride, tid, block),
                  bits == kEmptyWord ? 0x7fffffffu : bits);
    if (block == op.blocks - 1)  // the words past the blocks: zeros (read with their group)
      for (int64_t w = op.blocks; w < op.stats_stride; ++w)
        store_relaxed(box + protocol::stats_word(op.stats, op.stats_stride, tid, static_cast<int>(w)), 0u);
  }
  parity ^= 1;
}

// The finisher's rstd of a GEMM reading a folded norm, for every row, into `rstd`
// (shared memory the consumers read); `smem` (the handoff's pre) holds the groups'
// sums meanwhile.
template <int kFinisherThreads>
struct FoldedRstd {
  static constexpr int kBatch = 4;  // 16-byte loads in flight per thread

  const Args& a;
  const OpDesc& op;
  float* smem;
  float* rstd;
  const uint32_t* box;  // this run's mailbox epoch
  int thread;

  __device__ void run() const {
    const int first_group = op.rstd_first / 4;
    const int groups = (op.rstd_first + op.rstd_blocks - 1) / 4 - first_group + 1;
    const int items = a.m * groups;  // item e: token e / groups, group first_group + e % groups
    auto at = [&](int e) {
      return box + protocol::stats_word(op.rstd_stats, op.rstd_stride, e / groups, 4 * (first_group + e % groups));
    };
    for (int first = thread; first < items; first += kFinisherThreads * kBatch) {
      uint4 v[kBatch];
      auto live = [&](int j) { return first + kFinisherThreads * j < items; };
      auto where = [&](int j) { return at(first + kFinisherThreads * j); };
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (live(j)) v[j] = load_relaxed16(where(j));
      poll_until_published(v, live, where);
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (!live(j)) continue;
        const int e = first + kFinisherThreads * j;
        const int block = 4 * (first_group + e % groups);
        const uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
        float s = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (block + q >= op.rstd_first && block + q < op.rstd_first + op.rstd_blocks)
            s = __fadd_rn(s, __uint_as_float(w[q]));
        smem[e] = s;
      }
    }
    dev::named_barrier_sync(kNormBarrier, kFinisherThreads);
    if (thread < a.m) {
      float total = 0.0f;
      for (int g = 0; g < groups; ++g) total = __fadd_rn(total, smem[thread * groups + g]);
      rstd[thread] = __frsqrt_rn(__fadd_rn(__fdiv_rn(total, static_cast<float>(op.rstd_k)), op.eps));
    }
  }
};

}  // namespace tpdecode::program
