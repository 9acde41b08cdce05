// The stream-K engine: out[M, N] = x[M, K] * W[N, K]^T for M <= 32, every CTA
// streaming the same number of weight bytes (the split: stream_k_plan.hpp).
//
// One CTA per grid slot, 5 warps. The producer warp walks the CTA's range as ring
// stages and fills each with bulk copies (TMA, cp.async.bulk): one copy per weight
// row of 2 * stage_cols bytes (evict-first: read once), one per activation row
// (the CTA reads x once per stage for all its warps). The weights do not depend
// on the previous kernel, so the first `stages` stages of W are requested before
// griddepcontrol.wait; the activations after it. Each stage has a "full" mbarrier
// (one arrival announcing the stage's bytes + the copies' bytes) and an "empty" one
// (one arrival per consumer warp). Some variants also request the weight bytes past
// the ring into L2 before the wait. Four consumer warps take the stage's 16-column
// steps round robin, each over all 64 rows (ldmatrix + mma.sync m16n8k16: W rows on
// the 16-wide side, tokens on the 8-wide side, FP32 accumulators). At the end of
// the CTA's part of a tile the warps' sums are added in warp order, then written
// (whole tile) or reduced with the tile's other contributors in CTA order (split
// tile; no atomics in the sum). One BF16 rounding; bitwise the same run to run for
// a given tactic.
//
// Rows past N (the last tile) are neither copied nor multiplied; x rows past M are
// zero. Shared memory per stage: [64 + 8 * token tiles rows, 2 * stage_cols + 16
// bytes]; the 16-byte pad puts 8 consecutive rows in 8 different bank groups.
#pragma once

#include <cuda_bf16.h>

#include <cuda/atomic>
#include <cstdint>

#include "tpdecode/device.cuh"
#include "gemm/stream_k_launch.hpp"
#include "gemm/stream_k_plan.hpp"

namespace tpdecode::stream_k {

// The CTA's shared memory, carved by `layout`.
struct Ring {
  Layout l;
  uint8_t* base;
  __device__ uint64_t* full(int slot) const { return reinterpret_cast<uint64_t*>(base + l.full_off) + slot; }
  __device__ uint64_t* empty(int slot) const { return reinterpret_cast<uint64_t*>(base + l.empty_off) + slot; }
  __device__ int* flag() const { return reinterpret_cast<int*>(base + l.flag_off); }
  __device__ uint8_t* w(int slot) const { return base + l.w_off + slot * l.stage_w_bytes; }
  __device__ uint8_t* x(int slot) const { return base + l.x_off + slot * l.stage_x_bytes; }
  __device__ float* red() const { return reinterpret_cast<float*>(base + l.red_off); }
};

__device__ __forceinline__ int rows_in_tile(const StreamKParams& p, int64_t tile) {
  const int64_t left = p.n - tile * kRows;
  return static_cast<int>(left < kRows ? left : kRows);
}

// ---- Producer warp ---------------------------------------------------------------
__device__ __forceinline__ void produce(const StreamKParams& p, const Ring& ring, int64_t begin, int64_t end,
                                        int lane) {
  const uint64_t policy = dev::evict_first_policy();
  const int stage_steps = p.stage_cols / kStepCols;
  const int64_t pitch = p.k * 2;  // bytes per row of W and of x
  const auto* w = static_cast<const uint8_t*>(p.w);
  const auto* x = static_cast<const uint8_t*>(p.x);
  auto announce = [&](const StageCursor& c, int slot) {
    if (lane == 0) {
      const int rows = rows_in_tile(p, c.tile()) + p.m;
      dev::mbar_arrive_expect_tx(ring.full(slot), static_cast<uint32_t>(rows * c.width() * kStepCols * 2));
    }
    __syncwarp();
  };
  auto issue_w = [&](const StageCursor& c, int slot) {
    const uint32_t bytes = static_cast<uint32_t>(c.width() * kStepCols * 2);
    const uint8_t* src = w + c.tile() * kRows * pitch + c.step() * kStepCols * 2;
    for (int r = lane; r < rows_in_tile(p, c.tile()); r += 32)
      dev::bulk_copy_to_shared(ring.w(slot) + r * ring.l.row_bytes, src + r * pitch, bytes, ring.full(slot), policy);
  };
  auto issue_x = [&](const StageCursor& c, int slot) {
    const uint32_t bytes = static_cast<uint32_t>(c.width() * kStepCols * 2);
    if (lane < p.m)
      dev::bulk_copy_to_shared(ring.x(slot) + lane * ring.l.row_bytes, x + lane * pitch + c.step() * kStepCols * 2,
                               bytes, ring.full(slot));
  };

  StageCursor c{begin, end, p.steps_per_tile, stage_steps};
  int i = 0;
  for (; i < p.stages && c.valid(); ++i, c.next()) {
    announce(c, i);
    issue_w(c, i);
  }
  // The weight bytes past the ring, into L2, while the previous kernel finishes.
  int64_t prefetch = p.l2_prefetch_bytes;
  for (StageCursor ahead = c; ahead.valid() && prefetch > 0; ahead.next()) {
    const uint32_t bytes = static_cast<uint32_t>(ahead.width() * kStepCols * 2);
    const uint8_t* src = w + ahead.tile() * kRows * pitch + ahead.step() * kStepCols * 2;
    const int rows = rows_in_tile(p, ahead.tile());
    for (int r = lane; r < rows; r += 32) dev::bulk_prefetch_l2(src + r * pitch, bytes);
    prefetch -= int64_t{rows} * bytes;
  }
  dev::pdl_wait();  // x is the previous kernel's output
  StageCursor early{begin, end, p.steps_per_tile, stage_steps};
  for (int j = 0; j < i; ++j, early.next()) issue_x(early, j);
  for (; c.valid(); ++i, c.next()) {
    const int slot = i % p.stages;
    dev::mbar_wait(ring.empty(slot), static_cast<uint32_t>((i / p.stages - 1) & 1));  // its previous use was read
    announce(c, slot);
    issue_w(c, slot);
    issue_x(c, slot);
  }
}

// ---- Consumer warps: the end of a tile ----------------------------------------------
template <int kTiles>
__device__ void finish_tile(const StreamKParams& p, const Ring& ring, int64_t tile, int cta,
                            float (&acc)[4][kTiles][4], int warp, int lane, int tid) {
  float* red = ring.red();  // [8 * kTiles tokens, kRedStride]
  const int rows = rows_in_tile(p, tile);
  const int g = lane / 4;
  const int t4 = lane % 4;
  // The CTA's partial: its warps' sums added in warp order.
  for (int w = 0; w < kConsumerWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int rt = 0; rt < 4; ++rt) {
        if (16 * rt >= rows) continue;
#pragma unroll
        for (int j = 0; j < kTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float& dst = red[(8 * j + 2 * t4 + (e & 1)) * kRedStride + 16 * rt + g + 8 * (e >> 1)];
            dst = w == 0 ? acc[rt][j][e] : dst + acc[rt][j][e];
          }
      }
    }
    dev::named_barrier_sync(1, kConsumerThreads);
  }

  auto* out = static_cast<__nv_bfloat16*>(p.out);
  const int64_t row0 = tile * kRows;
  const int elems = p.m * kRows;  // e = token * 64 + row
  const Contributors who = contributors(p.total_steps, p.ctas, p.steps_per_tile, tile);
  if (who.first == who.last) {
    for (int e = tid; e < elems; e += kConsumerThreads)
      if (e % kRows < rows)
        out[e / kRows * p.out_stride + row0 + e % kRows] = __float2bfloat16_rn(red[e / kRows * kRedStride + e % kRows]);
  } else {
    auto partial = [&](int c) {
      return p.partials + (static_cast<int64_t>(c) * 2 + partial_slot(p.total_steps, p.ctas, p.steps_per_tile, c, tile)) *
                              kPartialFloats;
    };
    float* mine = partial(cta);
    for (int e = tid; e < elems; e += kConsumerThreads)
      if (e % kRows < rows) __stcg(mine + e, red[e / kRows * kRedStride + e % kRows]);
    __threadfence();
    dev::named_barrier_sync(1, kConsumerThreads);
    if (tid == 0) {
      // Why acq_rel: the release publishes this CTA's partial (every consumer thread
      // fenced before the barrier); the acquire makes the earlier arrivals' visible.
      cuda::atomic_ref<unsigned, cuda::thread_scope_device> arrived(p.counters[who.first]);
      const unsigned contributors = static_cast<unsigned>(who.last - who.first + 1);
      const bool last = arrived.fetch_add(1u, cuda::memory_order_acq_rel) == contributors - 1;
      if (last) arrived.store(0u, cuda::memory_order_relaxed);  // every contributor has counted: ready for the next call
      *ring.flag() = last;
    }
    dev::named_barrier_sync(1, kConsumerThreads);
    if (*ring.flag()) {
      __threadfence();
      for (int e = tid; e < elems; e += kConsumerThreads) {
        if (e % kRows >= rows) continue;
        float sum = __ldcg(partial(who.first) + e);
        for (int c = who.first + 1; c <= who.last; ++c) sum += __ldcg(partial(c) + e);
        out[e / kRows * p.out_stride + row0 + e % kRows] = __float2bfloat16_rn(sum);
      }
    }
  }
  dev::named_barrier_sync(1, kConsumerThreads);  // red and the flag serve the next tile
}

// ---- Consumer warps -------------------------------------------------------------
template <int kTiles>
__device__ void consume(const StreamKParams& p, const Ring& ring, int64_t begin, int64_t end, int cta, int warp,
                        int lane, int tid) {
  dev::pdl_wait();  // out and the workspace may still be in use by the previous kernel
  const int stage_steps = p.stage_cols / kStepCols;
  const int row_bytes = ring.l.row_bytes;
  // ldmatrix row addresses of this lane (see dev::ldmatrix_x4): A = W rows 0-15 of a
  // row tile, matrices (rows 0-7, 8-15) x (k 0-7, 8-15); B = x tokens, matrices
  // (k 0-7, 8-15) x (tokens 0-7, 8-15).
  const uint32_t a_lane = ((lane % 8) + 8 * ((lane / 8) % 2)) * row_bytes + 16 * (lane / 16);
  const uint32_t b_lane = ((lane % 8) + (kTiles == 1 ? 0 : 8 * (lane / 16))) * row_bytes + 16 * ((lane / 8) % 2);
  float acc[4][kTiles][4] = {};
  int i = 0;
  for (StageCursor c{begin, end, p.steps_per_tile, stage_steps}; c.valid(); c.next(), ++i) {
    const int slot = i % p.stages;
    dev::mbar_wait(ring.full(slot), static_cast<uint32_t>((i / p.stages) & 1));
    const int rows = rows_in_tile(p, c.tile());
    const uint32_t ws = dev::shared_address(ring.w(slot)) + a_lane;
    const uint32_t xs = dev::shared_address(ring.x(slot)) + b_lane;
    for (int s = warp; s < c.width(); s += kConsumerWarps) {
      uint32_t b[kTiles][2];
      if constexpr (kTiles == 1) {
        dev::ldmatrix_x2(b[0], xs + 32 * s);
      } else {
#pragma unroll
        for (int jj = 0; jj < kTiles / 2; ++jj) {
          uint32_t r[4];
          dev::ldmatrix_x4(r, xs + jj * 16 * row_bytes + 32 * s);
          b[2 * jj][0] = r[0];
          b[2 * jj][1] = r[1];
          b[2 * jj + 1][0] = r[2];
          b[2 * jj + 1][1] = r[3];
        }
      }
#pragma unroll
      for (int rt = 0; rt < 4; ++rt) {
        if (16 * rt >= rows) continue;
        uint32_t a[4];
        dev::ldmatrix_x4(a, ws + rt * 16 * row_bytes + 32 * s);
#pragma unroll
        for (int j = 0; j < kTiles; ++j) dev::mma_bf16(acc[rt][j], a[0], a[1], a[2], a[3], b[j][0], b[j][1]);
      }
    }
    __syncwarp();
    if (lane == 0) dev::mbar_arrive(ring.empty(slot));  // this warp is done reading the stage
    if (c.ends_segment()) {
      finish_tile<kTiles>(p, ring, c.tile(), cta, acc, warp, lane, tid);
#pragma unroll
      for (int rt = 0; rt < 4; ++rt)
#pragma unroll
        for (int j = 0; j < kTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[rt][j][e] = 0.0f;
    }
  }
}

template <int kTiles>
__global__ void __launch_bounds__(kThreads, 2) stream_k_kernel(const StreamKParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const Ring ring{layout(kTiles, p.stage_cols, p.stages), smem};
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int cta = static_cast<int>(blockIdx.x);
  const int64_t begin = range_begin(p.total_steps, p.ctas, cta);
  const int64_t end = range_begin(p.total_steps, p.ctas, cta + 1);

  // Why at entry: the next kernel in the stream may launch once every CTA of this
  // one runs; its CTAs take SMs as ours leave (or beside ours where shared memory
  // allows) and request their weights while our tail drains. It reads our output
  // only after its own griddepcontrol.wait, which waits for this whole grid.
  dev::pdl_launch_dependents();
  if (tid == 0) {
    for (int s = 0; s < p.stages; ++s) {
      dev::mbar_init(ring.full(s), 1);
      dev::mbar_init(ring.empty(s), kConsumerWarps);
    }
    dev::mbar_init_fence();
  }
  // x rows past M are never copied: zero them once (their products are never stored).
  const int pieces = ring.l.row_bytes / 16;  // 16-byte pieces per row
  const int pad_rows = 8 * kTiles - p.m;
  for (int q = tid; q < p.stages * pad_rows * pieces; q += kThreads) {
    const int s = q / (pad_rows * pieces);
    const int r = q % (pad_rows * pieces);
    reinterpret_cast<uint4*>(ring.x(s) + (p.m + r / pieces) * ring.l.row_bytes)[r % pieces] = make_uint4(0, 0, 0, 0);
  }
  __syncthreads();
  if (warp == kConsumerWarps)
    produce(p, ring, begin, end, lane);
  else
    consume<kTiles>(p, ring, begin, end, cta, warp, lane, tid);
}

}  // namespace tpdecode::stream_k
