// The wgmma engine as tiles: device functions that stream weight tiles and their
// activations through a shared-memory ring and multiply them with warpgroup MMA, so
// that a kernel (wgmma_engine.cu) or a program of several ops runs the same units.
//
// Roles of a CTA (kThreads threads, wgmma_plan.hpp):
//  - warps 0-3, the consumer warpgroup: per chunk of 64 K columns, waits for its
//    stage, runs 4 x sub_tiles wgmma m64nNk16 (the weight tile as A: 64 weight rows
//    per instruction, K-major, 128-byte swizzle; the activations as B: N = tokens),
//    and releases the stage once those MMAs completed; FP32 accumulators in
//    registers, one chain per 16-column step of the chunk (kChains); then stores
//    the unit's outputs from them (store_unit, a CTA alone) or reduces the unit
//    over the cluster (reduce_unit). In the wide form (multiply_unit_wide)
//    4 wgmma m64n(rows)k16 instead: the activations as A, the weight tile as B;
//  - warp 4, lane 0: the weight producer: one TMA box of [rows, 64] (the block's
//    weight rows) per stage, issued as soon as the stage is free. It never waits for
//    the previous kernel: weights do not depend on it;
//  - warp 5, lane 0: the activation producer: one TMA box of [tokens, 64] of x into
//    the same stage (64 rows in the wide form; rows m .. on arrive as zeros), after
//    griddepcontrol.wait.
// A stage is full once both boxes' bytes landed (full: 2 arrivals with their
// transaction bytes), and free once the 4 consumer warps' MMAs on it completed
// (empty: 4 arrivals).
//
// Split-K: the `split` CTAs of a cluster take consecutive K ranges of the same
// units; each stores its FP32 partials, and each sums 1/split of the unit's outputs
// over ranks 0 .. split-1 in that order through distributed shared memory; one
// BF16 rounding. No atomics: bitwise identical from run to run.
#pragma once

#include <cooperative_groups.h>
#include <cuda.h>

#include <concepts>
#include <cstdint>

#include "gemm/wgmma_ops.cuh"
#include "gemm/wgmma_plan.hpp"

namespace tpdecode::wgmma {

namespace cg = cooperative_groups;

inline constexpr int kConsumerWarps = kConsumerThreads / 32;
inline constexpr int kWeightWarp = kConsumerWarps;          // warp 4
inline constexpr int kActivationWarp = kConsumerWarps + 1;  // warp 5
inline constexpr int kEpilogueBarrier = 1;                  // named barrier of the consumer warpgroup
// Independent accumulator chains: step s of every chunk's 4 k16 steps accumulates
// into chain s % chains, and the chains are added in order 0 + 1 + ... once per
// unit. Why: a wgmma waits for the previous one on the same accumulators, so one
// chain streams one k16 step per wgmma latency (a CTA measured 32 GB/s at best);
// the order depends on nothing but K and the chain count, so every launch shape of
// a split gives the same bits. kChains (4) everywhere but where registers are short
// (a caller's choice: the accumulator array's first extent).
inline constexpr int kChains = kChunkK / 16;

// Where a consumer thread's accumulator i lies in wgmma's fragment of d[64 rows,
// tokens] of one 64-row sub-tile (warp and lane within the consumer warpgroup).
__device__ __forceinline__ int fragment_token(int lane, int i) { return 8 * (i / 4) + 2 * (lane % 4) + i % 2; }
__device__ __forceinline__ int fragment_row(int warp, int lane, int i) {
  return 16 * warp + lane / 4 + 8 * ((i % 4) / 2);
}

// A K range of one weight row block: what the ring streams, one K step per stage
// (a step: kDepth chunks of kChunkK columns).
struct Unit {
  int64_t row0;    // first weight row
  int step_begin;  // K steps [step_begin, step_end)
  int step_end;
};

// Where a role is in the ring: stage and phase parity of its next chunk.
struct Cursor {
  int stage = 0;
  uint32_t parity = 0;
  __device__ void next(int stages) {
    if (++stage == stages) {
      stage = 0;
      parity ^= 1;
    }
  }
};

// The ring of one CTA: stages of weight and activation tiles, then the barriers. A
// stage holds kDepth chunks: [kDepth][kWRows][64] of the weight and
// [kDepth][kXRows][64] of x (one tensor-map box each: wgmma_tile_map at kDepth).
template <int kWRows, int kXRows, int kDepth = 1>
struct Ring {
  static constexpr int kWChunkBytes = kWRows * kChunkK * 2;
  static constexpr int kWBytes = kDepth * kWChunkBytes;
  static constexpr int kXChunkBytes = kXRows * kChunkK * 2;
  static constexpr int kXBytes = kDepth * kXChunkBytes;
  static constexpr int kStageBytes = kWBytes + kXBytes;
  uint8_t* base;  // 1024-byte aligned
  int stages;
  uint64_t* full;
  uint64_t* empty;
  __device__ uint8_t* w(int s) const { return base + s * kStageBytes; }
  __device__ uint8_t* x(int s) const { return base + s * kStageBytes + kWBytes; }
};

// The split-K partials of one CTA and the barriers that hand them between the
// CTAs of its cluster: ready[q] completes once every CTA stored its partials of
// buffer q's current unit; freed[q] once every CTA has read them.
struct Partials {
  float* buffers;  // [2, tokens, stride] f32
  int buffer_floats;
  int stride;
  uint64_t* ready;  // [2]
  uint64_t* freed;  // [2]
  int split;
  int rank;
  __device__ float* buffer(int q) const { return buffers + q * buffer_floats; }
};

// Thread 0 of the CTA: initialises the ring's and the partials' barriers, then
// fences once. Why one thread: with a barrier pair and a fence per thread, the
// first weight copy left ~90 cycles later per stage of the ring (a CTA's trace on
// an H200: 2,600 cycles after its start at 7 stages, 4,300 at 24;
// docs/performance.md), and mbarrier.init is one shared-memory store.
template <int kWRows, int kXRows, int kDepth>
__device__ __forceinline__ void init_barriers(const Ring<kWRows, kXRows, kDepth>& ring, const Partials& p) {
  if (threadIdx.x != 0) return;
  for (int s = 0; s < ring.stages; ++s) {
    dev::mbar_init(ring.full + s, 2);
    dev::mbar_init(ring.empty + s, kConsumerWarps);
  }
  for (int q = 0; q < 2; ++q) {
    dev::mbar_init(p.ready + q, static_cast<uint32_t>(p.split));
    dev::mbar_init(p.freed + q, static_cast<uint32_t>(p.split));
  }
  dev::mbar_init_fence();
}

// One K step of a [rows, k] operand's tensor map (wgmma_tile_map at kDepth) into a
// stage: one box of kDepth chunks (one copy to issue and count per stage).
template <int kDepth>
__device__ __forceinline__ void load_step(uint8_t* smem, const CUtensorMap* map, int step, int row0, uint64_t* bar,
                                          uint64_t policy) {
  if constexpr (kDepth == 1)
    dev::tma_load_2d(smem, map, step * kChunkK, row0, bar, policy);
  else
    dev::tma_load_3d(smem, map, 0, row0, step * kDepth, bar, policy);
}

// A cap on the weight stages in flight (issued, not landed): the stages' copies
// complete on `landed` (one barrier per stage, one arrival: the producer's) and at
// most `stages` (<= the ring's) are in flight at once (landed_wait); a copy issued
// while the shared counter `low_while` is above 0 (null: never) waits instead for
// the use `low_stages` before it (as few in flight once the earlier ones landed).
// Null `landed`: no cap, the copies complete on the ring's full barriers.
struct InFlightCap {
  uint64_t* landed = nullptr;
  int stages = 0;
  const volatile int* low_while = nullptr;
  int low_stages = 0;
  __device__ int now() const { return low_while != nullptr && *low_while > 0 ? low_stages : stages; }
};

// The weight producer (one thread): every unit's steps, in order, each as soon as
// its stage is free (and, with a cap, an earlier stage has landed):
// schedule.load_weights(i, step, stage memory, barrier, policy) issues unit i's
// copies of that step, counted on the barrier (kWBytes in all).
// A schedule may time the producer's waits (GemmProgram's timeline): where
// schedule.times_waits(), schedule.waited(i, free_ns, cap_ns) gets the global-timer
// time unit i's steps waited for a free stage and for the cap, before its last
// step's copy is issued (so the CTA's run cannot have ended).
template <class Schedule>
concept TimesProducerWaits = requires(const Schedule& s) {
  { s.times_waits() } -> std::convertible_to<bool>;
  s.waited(0, uint64_t{}, uint64_t{});
};

template <int kWRows, int kXRows, int kDepth, class Schedule>
__device__ __forceinline__ void produce_weights(const Ring<kWRows, kXRows, kDepth>& ring, const Schedule& schedule,
                                                Cursor& cur, const InFlightCap& cap = {}) {
  const uint64_t policy = dev::evict_first_policy();
  bool timed = false;
  if constexpr (TimesProducerWaits<Schedule>) timed = schedule.times_waits();
  int issued = 0;
  for (int i = 0; i < schedule.count(); ++i) {
    const Unit u = schedule.unit(i);
    uint64_t free_ns = 0, cap_ns = 0;
    for (int c = u.step_begin; c < u.step_end; ++c) {
      const uint64_t t0 = timed ? dev::global_timer_ns() : 0;
      dev::mbar_wait(ring.empty + cur.stage, cur.parity ^ 1);
      const uint64_t t1 = timed ? dev::global_timer_ns() : 0;
      uint64_t* bar = ring.full + cur.stage;
      if (cap.landed != nullptr) {
        const LandedWait w = landed_wait(issued, cap.now(), ring.stages);
        if (w.wait) dev::mbar_wait(cap.landed + w.stage, w.parity);
        bar = cap.landed + cur.stage;
      }
      if constexpr (TimesProducerWaits<Schedule>) {
        if (timed) {
          free_ns += t1 - t0;
          cap_ns += dev::global_timer_ns() - t1;
          if (c + 1 == u.step_end) schedule.waited(i, free_ns, cap_ns);
        }
      }
      dev::mbar_arrive_expect_tx(bar, Ring<kWRows, kXRows, kDepth>::kWBytes);
      schedule.load_weights(i, c, ring.w(cur.stage), bar, policy);
      cur.next(ring.stages);
      ++issued;
    }
  }
}

// The activation producer (one thread): the [kXRows, 64] boxes of x at every
// unit's steps (x's tensor map: [m, k], rows past m arrive as zeros).
// schedule.activation_map(i): unit i's x; schedule.await_inputs(i) returns once x
// may be read (the caller has waited for the previous kernel: griddepcontrol.wait).
template <int kWRows, int kXRows, int kDepth, class Schedule>
__device__ __forceinline__ void produce_activations(const Ring<kWRows, kXRows, kDepth>& ring,
                                                    const Schedule& schedule, Cursor& cur) {
  // Why evict-last: every row block of the weight reads these activations again.
  const uint64_t policy = dev::evict_last_policy();
  const CUtensorMap* prefetched = nullptr;
  for (int i = 0; i < schedule.count(); ++i) {
    const Unit u = schedule.unit(i);
    const CUtensorMap* map = schedule.activation_map(i);
    if (map != prefetched) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
      prefetched = map;
    }
    schedule.await_inputs(i);
    for (int c = u.step_begin; c < u.step_end; ++c) {
      dev::mbar_wait(ring.empty + cur.stage, cur.parity ^ 1);
      dev::mbar_arrive_expect_tx(ring.full + cur.stage, Ring<kWRows, kXRows, kDepth>::kXBytes);
      load_step<kDepth>(ring.x(cur.stage), map, c, 0, ring.full + cur.stage, policy);
      cur.next(ring.stages);
    }
  }
}

// The consumer warpgroup: one unit's steps, each as soon as its stage is full:
// mmas(stage) issues that stage's wgmmas (after a wgmma_fence), and each stage is
// released as soon as its MMAs completed (the previous stage's group once the
// next one is committed). On return every MMA issued has completed; the caller
// fences its accumulators.
template <class Ring, class StageMmas>
__device__ __forceinline__ void stream_unit(const Ring& ring, const Unit& u, Cursor& cur, StageMmas&& mmas) {
  const bool releases = threadIdx.x % 32 == 0;  // one arrival per consumer warp
  int held = -1;  // the stage whose MMAs may still be in flight
  for (int c = u.step_begin; c < u.step_end; ++c) {
    const int st = cur.stage;
    dev::mbar_wait(ring.full + st, cur.parity);
    dev::wgmma_fence();
    mmas(st);
    dev::wgmma_commit();
    if (held >= 0) {
      dev::wgmma_wait<1>();  // the previous stage's group has completed
      if (releases) dev::mbar_arrive(ring.empty + held);
    }
    held = st;
    cur.next(ring.stages);
  }
  dev::wgmma_wait<0>();
  if (held >= 0 && releases) dev::mbar_arrive(ring.empty + held);
}

// The consumer warpgroup: the products of one unit's steps, accumulated into
// acc[0][sub][...] (wgmma's fragment of d[64 rows, tokens] per 64-row sub-tile; the
// other kChainCount - 1 chains are scratch), each stage released as soon as its MMAs
// completed.
template <int kWRows, int kTokens, int kDepth, int kChainCount>
__device__ __forceinline__ void multiply_unit(const Ring<kWRows, kTokens, kDepth>& ring, const Unit& u, Cursor& cur,
                                              float (&acc)[kChainCount][kWRows / kTileRows][kTokens / 2]) {
  static_assert(kChains % kChainCount == 0, "every chain takes the same k16 steps of a chunk");
  constexpr int kSub = kWRows / kTileRows;
#pragma unroll
  for (int chain = 0; chain < kChainCount; ++chain)
#pragma unroll
    for (int s = 0; s < kSub; ++s) {
#pragma unroll
      for (int i = 0; i < kTokens / 2; ++i) acc[chain][s][i] = 0.0f;
      dev::fence_operands(acc[chain][s]);
    }
  stream_unit(ring, u, cur, [&](int st) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d)
#pragma unroll
      for (int k16 = 0; k16 < kChunkK / 16; ++k16) {
        const uint64_t b = dev::sw128_descriptor(ring.x(st) + d * Ring<kWRows, kTokens, kDepth>::kXChunkBytes, k16);
#pragma unroll
        for (int s = 0; s < kSub; ++s)
          dev::wgmma_bf16<kTokens>(acc[k16 % kChainCount][s],
                                   dev::sw128_descriptor(ring.w(st) + (d * kSub + s) * kTileBytes, k16), b, 1);
      }
  });
#pragma unroll
  for (int chain = 0; chain < kChainCount; ++chain)
#pragma unroll
    for (int s = 0; s < kSub; ++s) dev::fence_operands(acc[chain][s]);
#pragma unroll
  for (int s = 0; s < kSub; ++s)
#pragma unroll
    for (int i = 0; i < kTokens / 2; ++i) {
      float sum = acc[0][s][i];
#pragma unroll
      for (int chain = 1; chain < kChainCount; ++chain) sum += acc[chain][s][i];
      acc[0][s][i] = sum;
    }
}

// The consumer warpgroup, after the products of this CTA's j-th unit of kRows
// weight rows: store(buffer) writes this thread's FP32 partials into the
// [tokens, p.stride] buffer; once every CTA of the cluster has, sums this CTA's
// 1/split of the first m tokens' outputs over ranks 0 .. split-1 in order and hands
// each to out(token, row in the unit, value). Every CTA of a cluster calls it for
// the same units in the same order.
template <int kRows, int kTokens, class Store, class Out>
__device__ __forceinline__ void reduce_partials(const Partials& p, int j, int m, Store&& store, Out&& out) {
  constexpr int kPerThread = kTokens * kRows / kConsumerThreads;  // outputs a thread sums at most
  const cg::cluster_group cluster = cg::this_cluster();
  const int tid = static_cast<int>(threadIdx.x);
  const int q = j & 1;
  const uint32_t use = static_cast<uint32_t>(j >> 1);
  float* mine = p.buffer(q);
  // Buffer q's previous unit was read by every CTA (a CTA alone: by this warpgroup,
  // whose named barrier below each unit ends its reads).
  if (use > 0 && p.split > 1) dev::mbar_wait_cluster(p.freed + q, (use - 1) & 1);
  store(mine);
  dev::named_barrier_sync(kEpilogueBarrier, kConsumerThreads);
  // Why release at cluster scope: the peers read these partials through distributed
  // shared memory once their wait on ready (acquire) returns; bar.sync made every
  // consumer thread's stores precede this thread's arrival.
  if (p.split > 1) {
    if (tid == 0)
      for (int r = 0; r < p.split; ++r) dev::mbar_arrive_remote(cluster.map_shared_rank(p.ready + q, r));
    dev::mbar_wait_cluster(p.ready + q, use & 1);
  }
  const int elements = m * kRows;
  const int e_begin = static_cast<int>(static_cast<int64_t>(elements) * p.rank / p.split);
  const int e_end = static_cast<int>(static_cast<int64_t>(elements) * (p.rank + 1) / p.split);
  // Every sum first, then the peers are told their partials are free, then the
  // outputs. Why in that order: the release of that arrival would otherwise wait
  // for this thread's global stores of the outputs. Why in batches of kBatch
  // elements with no branch between their reads (past e_end, the last element
  // again): the reads of a batch are in flight together, where a branch after each
  // element kept one in flight (with it, a CTA's epilogue of 64 rows x 32 tokens,
  // 16 elements a thread, took ~6,500 cycles at split 1; docs/performance.md); a
  // batch wholly past e_end is skipped (reading every slot cost the wide form's
  // splits, whose ranks own few of them, 2.5 x).
  constexpr int kBatch = 8;
  float sums[kPerThread];
#pragma unroll
  for (int g = 0; g < kPerThread; g += kBatch) {
    if (e_begin + tid + g * kConsumerThreads >= e_end) break;
#pragma unroll
    for (int i = g; i < g + kBatch && i < kPerThread; ++i) {
      const int e = min(e_begin + tid + i * kConsumerThreads, e_end - 1);
      const int at = (e / kRows) * p.stride + e % kRows;
      float part[8];
#pragma unroll
      for (int r = 0; r < 8; ++r) part[r] = r < p.split ? cluster.map_shared_rank(mine, r)[at] : 0.0f;
      float sum = part[0];
#pragma unroll
      for (int r = 1; r < 8; ++r)
        if (r < p.split) sum += part[r];
      sums[i] = sum;
    }
  }
  dev::named_barrier_sync(kEpilogueBarrier, kConsumerThreads);
  if (p.split > 1 && tid == 0)
    for (int r = 0; r < p.split; ++r) dev::mbar_arrive_remote(cluster.map_shared_rank(p.freed + q, r));
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int e = e_begin + tid + i * kConsumerThreads;
    if (e < e_end) out(e / kRows, e % kRows, sums[i]);
  }
}

// reduce_partials after multiply_unit (acc = its acc[0]): the partials of kSub
// 64-row sub-tiles.
template <int kSub, int kTokens, class Out>
__device__ __forceinline__ void reduce_unit(const Partials& p, int j, const float (&acc)[kSub][kTokens / 2], int m,
                                            Out&& out) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  reduce_partials<kSub * kTileRows, kTokens>(
      p, j, m,
      [&](float* mine) {
#pragma unroll
        for (int s = 0; s < kSub; ++s)
#pragma unroll
          for (int i = 0; i < kTokens / 2; ++i) {
            const int token = fragment_token(lane, i);
            const int row = s * kTileRows + fragment_row(warp, lane, i);
            mine[token * p.stride + row] = acc[s][i];
          }
      },
      out);
}

// A CTA alone (split 1), after multiply_unit (acc = its acc[0]): each accumulator of
// the first m tokens straight to out(token, row in the unit, value), with no
// partials (the bits reduce_unit gives at split 1: a sum of one part).
template <int kSub, int kTokens, class Out>
__device__ __forceinline__ void store_unit(const float (&acc)[kSub][kTokens / 2], int m, Out&& out) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
#pragma unroll
  for (int s = 0; s < kSub; ++s)
#pragma unroll
    for (int i = 0; i < kTokens / 2; ++i) {
      const int token = fragment_token(lane, i);
      if (token < m) out(token, s * kTileRows + fragment_row(warp, lane, i), acc[s][i]);
    }
}

// ---- The wide tiles: the weight tile as B (wgmma_plan.hpp, wide_layout) ---------
// Where a consumer thread's accumulator i lies in the wide kernels' d[64 tokens,
// rows]: wgmma's fragment with the tokens as its rows.
__device__ __forceinline__ int wide_token(int warp, int lane, int i) { return fragment_row(warp, lane, i); }
__device__ __forceinline__ int wide_row(int lane, int i) { return fragment_token(lane, i); }

// The consumer warpgroup: the products of one unit's steps in the wide form, one
// wgmma m64n(kRows)k16 per 16 columns (A: the stage's [64, 64] x tile, rows past m
// zero; B: its [kRows, 64] weight tile), every k16 step into acc in order.
template <int kRows, int kDepth>
__device__ __forceinline__ void multiply_unit_wide(const Ring<kRows, kTileRows, kDepth>& ring, const Unit& u,
                                                   Cursor& cur, float (&acc)[kRows / 2]) {
  using R = Ring<kRows, kTileRows, kDepth>;
#pragma unroll
  for (int i = 0; i < kRows / 2; ++i) acc[i] = 0.0f;
  dev::fence_operands(acc);
  stream_unit(ring, u, cur, [&](int st) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d)
#pragma unroll
      for (int k16 = 0; k16 < kChunkK / 16; ++k16)
        dev::wgmma_bf16<kRows>(acc, dev::sw128_descriptor(ring.x(st) + d * R::kXChunkBytes, k16),
                               dev::sw128_descriptor(ring.w(st) + d * R::kWChunkBytes, k16), 1);
  });
  dev::fence_operands(acc);
}

// reduce_partials after multiply_unit_wide: the [kTokens, kRows] partials.
template <int kRows, int kTokens, class Out>
__device__ __forceinline__ void reduce_unit_wide(const Partials& p, int j, const float (&acc)[kRows / 2], int m,
                                                 Out&& out) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  reduce_partials<kRows, kTokens>(
      p, j, m,
      [&](float* mine) {
#pragma unroll
        for (int i = 0; i < kRows / 2; ++i) {
          const int token = wide_token(warp, lane, i);
          if (token < kTokens) mine[token * p.stride + wide_row(lane, i)] = acc[i];
        }
      },
      out);
}

// store_unit after multiply_unit_wide.
template <int kRows, class Out>
__device__ __forceinline__ void store_unit_wide(const float (&acc)[kRows / 2], int m, Out&& out) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (16 * warp >= m) return;  // this warp's 16 tokens are all padding
#pragma unroll
  for (int i = 0; i < kRows / 2; ++i) {
    const int token = wide_token(warp, lane, i);
    if (token < m) out(token, wide_row(lane, i), acc[i]);
  }
}

// The consumer warpgroup, after its last unit: waits until every CTA of the cluster
// has read this CTA's partials (its shared memory must outlive their reads, and no
// peer arrives on its barriers after this).
__device__ __forceinline__ void drain_partials(const Partials& p, int units) {
  if (p.split == 1) return;
  for (int q = 0; q < 2; ++q) {
    const int uses = (units - q + 1) / 2;  // units j < `units` with j % 2 == q
    if (uses > 0) dev::mbar_wait_cluster(p.freed + q, static_cast<uint32_t>(uses - 1) & 1);
  }
}

}  // namespace tpdecode::wgmma
