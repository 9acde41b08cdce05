// The direct engine: out[M, N] = x[M, K] * W[N, K]^T for M <= 8 (gemm_tactic.hpp).
//
// Work. W is cut into tiles of 16 rows and each tile's K into steps of 128 columns;
// the (tile, step) sequence, tile-major, is split into equal contiguous ranges, one
// per warp (stream_k_plan.hpp's split with warps as its workers). A warp walks its
// range kDirectGroup steps at a time: it requests those steps' weight bytes straight into
// registers (per lane 4 x 16 bytes of W rows g and g + 8 per step), then the
// activations of token g (through L1: every warp of the SM reads them), then
// multiplies (dev::mma_bf16_piece: W rows on the MMA's 16-wide side, tokens on the
// 8-wide side, FP32 accumulators).
//
// A tile inside one warp's range is written by that warp. A split tile's
// contributors (consecutive warps) write their FP32 partials to the workspace and
// count themselves on the tile's counter; the last to arrive sums the partials in
// worker order (= K order), rounds once to BF16 and resets the counter. No atomics
// in the sum and no warp ever waits for another: bitwise the same run to run for a
// given variant, and safe when not every CTA is resident.
#include <cuda_bf16.h>

#include <cuda/atomic>

#include "gemm/direct_gemm_launch.hpp"
#include "gemm/stream_k_plan.hpp"
#include "tpdecode/device.cuh"
#include "tpdecode/launch.cuh"

namespace tpdecode {
namespace direct {

constexpr int kThreads = kDirectWarps * 32;

// The end of a warp's part of `tile`: acc holds (row g, token 2t), (g, 2t + 1),
// (g + 8, 2t), (g + 8, 2t + 1) of the tile's rows.
__device__ __forceinline__ void finish_tile(const DirectParams& p, int64_t tile, int worker, const float (&acc)[4],
                                            int lane) {
  const int g = lane / 4;
  const int t = lane % 4;
  auto* out = static_cast<__nv_bfloat16*>(p.out);
  const int64_t row0 = tile * kDirectRows;
  const stream_k::Contributors who = stream_k::contributors(p.total_steps, p.workers, p.steps_per_tile, tile);
  if (who.first == who.last) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int token = 2 * t + (e & 1);
      if (token < p.m) out[token * p.out_stride + row0 + g + 8 * (e >> 1)] = __float2bfloat16_rn(acc[e]);
    }
    return;
  }
  auto partial = [&](int c) {  // [8 tokens, 16 rows]
    const int slot = stream_k::partial_slot(p.total_steps, p.workers, p.steps_per_tile, c, tile);
    return p.partials + (static_cast<int64_t>(c) * 2 + slot) * kDirectPartialFloats;
  };
  float* mine = partial(worker);
#pragma unroll
  for (int e = 0; e < 4; ++e) __stcg(mine + (2 * t + (e & 1)) * kDirectRows + g + 8 * (e >> 1), acc[e]);
  __threadfence();
  __syncwarp();
  int last = 0;
  if (lane == 0) {
    // Why acq_rel: the release publishes this warp's partial (every lane fenced
    // before the warp barrier); the acquire makes the earlier arrivals' visible.
    cuda::atomic_ref<unsigned, cuda::thread_scope_device> arrived(p.counters[who.first]);
    const unsigned contributors = static_cast<unsigned>(who.last - who.first + 1);
    last = arrived.fetch_add(1u, cuda::memory_order_acq_rel) == contributors - 1;
    if (last) arrived.store(0u, cuda::memory_order_relaxed);  // every contributor has counted: ready for the next call
  }
  if (!__shfl_sync(0xffffffffu, last, 0)) return;
  __threadfence();
  for (int e = lane; e < p.m * kDirectRows; e += 32) {
    float sum = __ldcg(partial(who.first) + e);
    for (int c = who.first + 1; c <= who.last; ++c) sum += __ldcg(partial(c) + e);
    out[(e / kDirectRows) * p.out_stride + row0 + e % kDirectRows] = __float2bfloat16_rn(sum);
  }
}

// Asks L2 for the weight bytes of steps [from, to) of a warp's range (one bulk
// prefetch per row and tile segment, lanes 0-15 one row each).
__device__ __forceinline__ void prefetch_l2(const DirectParams& p, int64_t from, int64_t to, int lane) {
  const auto* w = static_cast<const uint8_t*>(p.w);
  for (int64_t pos = from; pos < to;) {
    const int64_t tile = pos / p.steps_per_tile;
    const int64_t tile_end = (tile + 1) * p.steps_per_tile;
    const int64_t segment_end = to < tile_end ? to : tile_end;
    if (lane < kDirectRows)
      dev::bulk_prefetch_l2(w + ((tile * kDirectRows + lane) * p.k + (pos - tile * p.steps_per_tile) * kDirectStepCols) * 2,
                            static_cast<uint32_t>((segment_end - pos) * kDirectStepCols * 2));
    pos = segment_end;
  }
}

// Why the register bound: two CTAs per SM (variant 1, or one beside the next
// kernel's) need <= 128 registers per thread.
__global__ void __launch_bounds__(kThreads, 2) direct_kernel(const DirectParams p) {
  // Why at entry: the next kernel in the stream may launch once every CTA of this
  // one runs; without shared memory its CTAs fit beside ours and request their
  // weights while our tail drains. It reads our output only after its own
  // griddepcontrol.wait, which waits for this whole grid.
  dev::pdl_launch_dependents();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int worker = static_cast<int>(blockIdx.x) * kDirectWarps + static_cast<int>(threadIdx.x) / 32;
  if (worker >= p.workers) return;
  const int g = lane / 4;
  const int t = lane % 4;
  const int64_t pitch = p.k / 8;  // 16-byte words per row of W and of x
  const auto* w = static_cast<const uint4*>(p.w);
  const auto* x = static_cast<const uint4*>(p.x) + g * pitch + t;  // token g, read only when g < m
  const bool has_token = g < p.m;
  const int64_t begin = stream_k::range_begin(p.total_steps, p.workers, worker);
  const int64_t end = stream_k::range_begin(p.total_steps, p.workers, worker + 1);
  bool waited = false;
  for (int64_t pos = begin; pos < end;) {
    const int64_t tile = pos / p.steps_per_tile;
    const int64_t first = pos - tile * p.steps_per_tile;  // the first step, within the tile
    const int64_t tile_end = (tile + 1) * p.steps_per_tile;
    const int64_t segment_end = end < tile_end ? end : tile_end;
    const int steps = static_cast<int>(segment_end - pos);
    const uint4* w_g = w + (tile * kDirectRows + g) * pitch + first * 16 + t;
    const uint4* w_g8 = w_g + 8 * pitch;
    const uint4* x_g = x + first * 16;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int s = 0; s < steps; s += kDirectGroup) {
      uint4 a[kDirectGroup][2][4];  // [step][row g, g + 8][column group i]
#pragma unroll
      for (int d = 0; d < kDirectGroup; ++d)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const bool in = s + d < steps;
          a[d][0][i] = in ? dev::load_once16(w_g + (s + d) * 16 + 4 * i) : uint4{};
          a[d][1][i] = in ? dev::load_once16(w_g8 + (s + d) * 16 + 4 * i) : uint4{};
        }
      // Why here: the weights do not depend on the previous kernel, so the first
      // request (and, in some variants, the next steps into L2) goes out before the
      // grid-dependency wait; x, out and the workspace are touched only after it.
      if (!waited) {
        if (p.l2_prefetch_steps > 0) {
          const int64_t from = begin + kDirectGroup < end ? begin + kDirectGroup : end;
          prefetch_l2(p, from, from + p.l2_prefetch_steps < end ? from + p.l2_prefetch_steps : end, lane);
        }
        dev::pdl_wait();
        waited = true;
      }
      uint4 b[kDirectGroup][4];
#pragma unroll
      for (int d = 0; d < kDirectGroup; ++d)
#pragma unroll
        for (int i = 0; i < 4; ++i) b[d][i] = has_token && s + d < steps ? __ldg(x_g + (s + d) * 16 + 4 * i) : uint4{};
#pragma unroll
      for (int d = 0; d < kDirectGroup; ++d) {
        if (s + d >= steps) break;
#pragma unroll
        for (int i = 0; i < 4; ++i) dev::mma_bf16_piece(acc, a[d][0][i], a[d][1][i], b[d][i]);
      }
    }
    finish_tile(p, tile, worker, acc, lane);
    pos = segment_end;
  }
}

}  // namespace direct

void launch_direct(const DirectParams& p, const DirectTactic& t, bool pdl, cudaStream_t stream) {
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(t.ctas));
  s.block = dim3(direct::kThreads);
  s.pdl = pdl;
  launch_kernel(direct::direct_kernel, s, stream, p);
}

}  // namespace tpdecode
