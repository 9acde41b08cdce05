// The warp split-K engine: out[M, N] = x[M, K] * W[N, K]^T for M <= 32.
//
// Grid (split, N / 16), clusters of `split` CTAs along x. A CTA owns one 16-row
// tile of W and 1/split of K; its 4 warps each stream a contiguous K range of that
// through a private 4-stage cp.async ring ([16, 128] bf16 per stage), and run
// mma.sync m16n8k16 with W's rows on the 16-wide (A) side and the tokens on the
// 8-wide (B) side. FP32 partials are summed in a fixed order: warps 0..3 in
// shared memory, then cluster ranks 0..split-1 through distributed shared memory
// by rank 0; one BF16 rounding. No atomics: bitwise identical from run to run.
//
// K permutation. The MMA's dot product does not care in which order K is
// visited, as long as A and B use the same order. Within a 128-column chunk,
// thread (g = lane / 4, t = lane % 4) loads 16 bytes at columns 32 i + 8 t
// (i = 0..3) of W rows g and g + 8 and of token g: exactly the A and B fragments
// of two MMAs (i, h = 0, 1), with logical columns {2t, 2t+1, 2t+8, 2t+9} mapped
// to physical 32 i + 8 t + 4 h + {0, 1, 2, 3}. So every thread reads back from
// the ring only the bytes it copied itself: no ldmatrix, no barrier in the loop.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "gemm/warp_splitk_launch.hpp"

namespace tpdecode::warp_splitk {

namespace cg = cooperative_groups;

inline constexpr int kThreads = kWarpWarps * 32;
inline constexpr int kPieces = 8;  // 16-byte copies per thread per stage: 2 rows x 4

__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// Why: the weights are read once per call; evict-first keeps them from pushing the
// activations (read by every CTA) out of L2.
__device__ __forceinline__ void copy16_evict_first(void* smem, const void* global, uint64_t policy) {
  const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2;" ::"r"(dst), "l"(global),
               "l"(policy)
               : "memory");
}

__device__ __forceinline__ void commit_group() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int kPending>
__device__ __forceinline__ void wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ uint4 load_shared16(const uint4* p) {
  uint4 v;
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}

// d += a * b, m16n8k16, BF16 in, FP32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <int kTiles>
__global__ void __launch_bounds__(kThreads) warp_splitk_kernel(const WarpSplitKParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint4* ring = reinterpret_cast<uint4*>(smem);  // [warps, stages, pieces, 32 lanes] x 16 B
  float* partials = reinterpret_cast<float*>(smem + kWarpWarps * kWarpStages * kWarpStageBytes);  // [warps, 8*tiles, 16] f32
  constexpr int kTokens = 8 * kTiles;

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int split = static_cast<int>(gridDim.x);
  const int unit = static_cast<int>(blockIdx.x) * kWarpWarps + warp;  // this warp's K range among split * warps
  const int units = split * kWarpWarps;
  const int c_begin = static_cast<int>(static_cast<int64_t>(p.chunks) * unit / units);
  const int count = static_cast<int>(static_cast<int64_t>(p.chunks) * (unit + 1) / units) - c_begin;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * 16;

  uint4* my_ring = ring + warp * kWarpStages * kPieces * 32 + lane;
  const auto* w = static_cast<const __nv_bfloat16*>(p.w);
  const __nv_bfloat16* w_rows[2] = {w + (n0 + g) * p.k + 8 * t, w + (n0 + g + 8) * p.k + 8 * t};
  const uint64_t policy = evict_first_policy();
  auto issue = [&](int c) {
    const int64_t kb = static_cast<int64_t>(c_begin + c) * kWarpChunkK;
    uint4* slot = my_ring + (c % kWarpStages) * kPieces * 32;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int i = 0; i < 4; ++i) copy16_evict_first(slot + (r * 4 + i) * 32, w_rows[r] + kb + 32 * i, policy);
  };

  // Why: the weights do not depend on the previous kernel, so their copies start
  // before the grid-dependency wait; the activations are read only after it.
#pragma unroll
  for (int c = 0; c < kWarpStages - 1; ++c) {
    if (c < count) issue(c);
    commit_group();
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");

  const auto* x = static_cast<const __nv_bfloat16*>(p.x);
  float acc[kTiles][4] = {};
  for (int c = 0; c < count; ++c) {
    const int64_t kb = static_cast<int64_t>(c_begin + c) * kWarpChunkK;
    uint4 xs[kTiles][4];  // token 8 j + g, columns 32 i + 8 t
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const int token = 8 * j + g;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        xs[j][i] = token < p.m ? __ldg(reinterpret_cast<const uint4*>(x + token * p.k + kb + 32 * i + 8 * t))
                               : make_uint4(0, 0, 0, 0);
    }
    wait_group<kWarpStages - 2>();
    const uint4* slot = my_ring + (c % kWarpStages) * kPieces * 32;
    uint4 ws[2][4];  // rows g, g + 8
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int i = 0; i < 4; ++i) ws[r][i] = load_shared16(slot + (r * 4 + i) * 32);
    // Refill the slot consumed in the previous iteration.
    if (c + kWarpStages - 1 < count) issue(c + kWarpStages - 1);
    commit_group();
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < kTiles; ++j)
          mma_bf16(acc[j], word(ws[0][i], 2 * h), word(ws[1][i], 2 * h), word(ws[0][i], 2 * h + 1),
                   word(ws[1][i], 2 * h + 1), word(xs[j][i], 2 * h), word(xs[j][i], 2 * h + 1));
  }
  wait_group<0>();
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

  // acc[j]: rows g (0, 1) and g + 8 (2, 3), tokens 8 j + 2 t (+1).
  float* mine = partials + warp * kTokens * 16;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int tok = 8 * j + 2 * t;
    mine[tok * 16 + g] = acc[j][0];
    mine[(tok + 1) * 16 + g] = acc[j][1];
    mine[tok * 16 + g + 8] = acc[j][2];
    mine[(tok + 1) * 16 + g + 8] = acc[j][3];
  }
  __syncthreads();
  // Fixed order: warps 0, 1, 2, 3 (into warp 0's slot), then ranks 0..split-1.
  for (int e = static_cast<int>(threadIdx.x); e < kTokens * 16; e += kThreads) {
    float s = partials[e];
#pragma unroll
    for (int v = 1; v < kWarpWarps; ++v) s += partials[v * kTokens * 16 + e];
    partials[e] = s;
  }
  auto store = [&](int e, float v) {
    const int tok = e / 16;
    if (tok < p.m) static_cast<__nv_bfloat16*>(p.out)[tok * p.out_stride + n0 + e % 16] = __float2bfloat16_rn(v);
  };
  if (split == 1) {
    __syncthreads();
    for (int e = static_cast<int>(threadIdx.x); e < kTokens * 16; e += kThreads) store(e, partials[e]);
    return;
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  if (cluster.block_rank() == 0) {
    for (int e = static_cast<int>(threadIdx.x); e < kTokens * 16; e += kThreads) {
      float s = partials[e];
      for (int r = 1; r < split; ++r) s += cluster.map_shared_rank(partials, r)[e];
      store(e, s);
    }
  }
  // Why: a rank's shared memory must stay alive until rank 0 has read it.
  cluster.sync();
}

}  // namespace tpdecode::warp_splitk
