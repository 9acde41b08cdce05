// The warp split-K engine: out[M, N] = x[M, K] * W[N, K]^T for M <= 32.
//
// Persistent grid (split, clusters), clusters of `split` CTAs along x. Cluster c
// takes the 64-row blocks c, c + clusters, ...; CTA rank r of it takes the r-th
// 1/split of K for every one of them. A CTA loads its K slice of x into shared
// memory once, then streams W: each of its 4 warps owns one 16-row tile of the
// current block and copies its own [16, 128] pieces through a `stages`-deep
// cp.async ring (evict-first). The ring runs on across block boundaries, so the
// stream does not drain between blocks. No barrier in the loop: a thread reads back
// only the W bytes it copied itself (its own cp.async.wait_group suffices) and x
// does not change.
//
// mma.sync m16n8k16 runs with W's rows on the 16-wide (A) side and the tokens on
// the 8-wide (B) side. At the end of each block the FP32 partials are summed over
// cluster ranks 0..split-1 in that order through distributed shared memory (each
// rank sums 1/split of the outputs); one BF16 rounding. No atomics: bitwise
// identical from run to run for a given tactic.
//
// K permutation. The MMA's dot product does not care in which order K is
// visited, as long as A and B use the same order. Within a chunk, thread
// (g = lane / 4, t = lane % 4) takes the 16 bytes at columns 32 i + 8 t
// (i = 0..3) of W rows g and g + 8 and of token g: the A and B fragments of two
// MMAs (h = 0, 1), logical columns {2t, 2t+1, 2t+8, 2t+9} being physical
// 32 i + 8 t + 4 h + {0, 1, 2, 3}. No ldmatrix, no shuffles.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "gemm/warp_splitk_launch.hpp"

namespace tpdecode::warp_splitk {

namespace cg = cooperative_groups;

inline constexpr int kThreads = kWarpWarps * 32;
inline constexpr int kWPieces = 8;  // 16-byte W copies per thread per stage: 2 rows x 4

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

// A position in this cluster's work: chunk `chunk` (0..count-1) of K slice of block `block`.
struct Cursor {
  int64_t block;
  int chunk;
  __device__ void advance(int count, int64_t step) {
    if (++chunk == count) {
      chunk = 0;
      block += step;
    }
  }
};

// Copies this CTA's K slice of x, [m, count x 128], into xs laid out as
// [count, 4 i, tokens, 4 t] x 16 B (rows m..tokens-1 zero), with plain loads: it is
// small, read from L2 once per call, and the W ring is already in flight meanwhile.
template <int kTokens>
__device__ __forceinline__ void load_x_slice(uint4* xs, const __nv_bfloat16* x, int64_t k, int m, int c_begin,
                                             int count, int tid) {
  constexpr int kBatch = 4;  // independent loads in flight per thread
  const int per_token = count * 16;
  const int pieces = kTokens * per_token;
  for (int q0 = tid; q0 < pieces; q0 += kBatch * kThreads) {
    uint4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int q = q0 + u * kThreads;
      const int token = q / per_token;
      const int col16 = q % per_token;  // 16-byte piece within the slice
      v[u] = make_uint4(0, 0, 0, 0);
      if (q < pieces && token < m)
        v[u] = *reinterpret_cast<const uint4*>(x + token * k + static_cast<int64_t>(c_begin) * kWarpChunkK + 8 * col16);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int q = q0 + u * kThreads;
      if (q >= pieces) break;
      const int token = q / per_token;
      const int col16 = q % per_token;
      const int chunk = col16 / 16;
      const int i = col16 % 16 / 4;
      xs[((chunk * 4 + i) * kTokens + token) * 4 + col16 % 4] = v[u];
    }
  }
}

template <int kTiles, int kStages>
__global__ void __launch_bounds__(kThreads, 1) warp_splitk_kernel(const WarpSplitKParams p) {
  constexpr int kTokens = 8 * kTiles;
  constexpr int kStagePieces = kWPieces * 32;    // one warp's stage: [8 pieces, 32 lanes] x 16 B
  constexpr int kChunkPieces = 4 * kTokens * 4;  // one chunk of x: [4 i, tokens, 4 t] x 16 B
  constexpr int kBlockOutputs = kTokens * kWarpCtaRows;
  extern __shared__ __align__(16) uint8_t smem[];
  uint4* ring_w = reinterpret_cast<uint4*>(smem);  // [warps, stages, 8 pieces, 32 lanes] x 16 B
  float* partials = reinterpret_cast<float*>(ring_w + kWarpWarps * kStages * kStagePieces);  // [2, tokens, 64]
  uint4* xs = reinterpret_cast<uint4*>(partials + 2 * kBlockOutputs);  // [count, 4 i, tokens, 4 t] x 16 B

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int split = static_cast<int>(gridDim.x);
  const int rank = static_cast<int>(blockIdx.x);
  const int c_begin = static_cast<int>(static_cast<int64_t>(p.chunks) * rank / split);
  const int count = static_cast<int>(static_cast<int64_t>(p.chunks) * (rank + 1) / split) - c_begin;
  const int64_t step = gridDim.y;  // blocks between two of this cluster's
  const int64_t blocks = (p.n + kWarpCtaRows - 1) / kWarpCtaRows;
  const int64_t my_blocks = (blocks - blockIdx.y + step - 1) / step;  // >= 1: gridDim.y <= blocks
  const int64_t total = my_blocks * count;                             // chunks this CTA streams

  const auto* w = static_cast<const __nv_bfloat16*>(p.w);
  uint4* my_ring = ring_w + warp * kStages * kStagePieces + lane;
  const uint64_t policy = evict_first_policy();
  auto tile_row = [&](int64_t block) { return block * kWarpCtaRows + 16 * warp; };

  // The producer side of the ring: the next chunk to copy is number `issued` (of
  // `total`), at cursor `at`, into stage `issue_stage`.
  Cursor at{blockIdx.y, 0};
  int64_t issued = 0;
  int issue_stage = 0;
  auto issue_next = [&] {
    if (issued < total && tile_row(at.block) < p.n) {  // the last block may hold fewer than 4 tiles
      const __nv_bfloat16* row = w + (tile_row(at.block) + g) * p.k +
                                 static_cast<int64_t>(c_begin + at.chunk) * kWarpChunkK + 8 * t;
      uint4* s = my_ring + issue_stage * kStagePieces;
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) copy16_evict_first(s + (r * 4 + i) * 32, row + r * 8 * p.k + 32 * i, policy);
    }
    commit_group();  // possibly empty: every thread counts the same groups
    if (issued < total) at.advance(count, step);
    ++issued;
    issue_stage = issue_stage == kStages - 1 ? 0 : issue_stage + 1;
  };

  // Why: the weights do not depend on the previous kernel, so their copies start
  // before the grid-dependency wait; x is read only after it.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue_next();
  asm volatile("griddepcontrol.wait;" ::: "memory");
  load_x_slice<kTokens>(xs, static_cast<const __nv_bfloat16*>(p.x), p.k, p.m, c_begin, count, tid);
  __syncthreads();

  cg::cluster_group cluster = cg::this_cluster();
  auto store = [&](int64_t block, int e, float v) {  // e = token * 64 + row: consecutive e, consecutive columns
    const int tok = e / kWarpCtaRows;
    const int64_t col = block * kWarpCtaRows + e % kWarpCtaRows;
    if (tok < p.m && col < p.n) static_cast<__nv_bfloat16*>(p.out)[tok * p.out_stride + col] = __float2bfloat16_rn(v);
  };
  // Sums block `block`'s partials (this CTA's in `part`) over the cluster and stores
  // them. Why two partial buffers: a peer may still read this block's while this
  // CTA fills the next one; the block after that is written only once every peer
  // has passed the next block's barrier, after its reads.
  auto finish_block = [&](int64_t block, const float* part) {
    if (split == 1) {
      __syncthreads();
      for (int e = tid; e < kBlockOutputs; e += kThreads) store(block, e, part[e]);
      return;
    }
    cluster.sync();
    const int per_rank = kBlockOutputs / split;  // 2^j, split <= 8 divides it
    for (int e = rank * per_rank + tid; e < (rank + 1) * per_rank; e += kThreads) {
      float v[kWarpMaxSplit];
#pragma unroll
      for (int r = 0; r < kWarpMaxSplit; ++r) v[r] = r < split ? cluster.map_shared_rank(part, r)[e] : 0.0f;
      float sum = v[0];
#pragma unroll
      for (int r = 1; r < kWarpMaxSplit; ++r)
        if (r < split) sum += v[r];
      store(block, e, sum);
    }
  };

  float acc[kTiles][4] = {};
  Cursor now{blockIdx.y, 0};
  int stage = 0;
  int buffer = 0;
  static_assert(kStages >= 2 && kStages <= 8, "cp.async.wait_group counts at most 7 younger groups here");
  for (int64_t f = 0; f < total; ++f) {
    // Why: the refill goes out before the wait, so `stages` chunks are in flight while
    // this warp waits for chunk f. Its slot was read by this thread in iteration f - 1.
    issue_next();
    wait_group<kStages - 1>();  // chunk f's group has kStages - 1 younger ones
    if (tile_row(now.block) < p.n) {
      const uint4* sw = my_ring + stage * kStagePieces;
      const uint4* sx = xs + now.chunk * kChunkPieces;
      uint4 ws[2][4];  // rows g, g + 8; columns 32 i + 8 t
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) ws[r][i] = load_shared16(sw + (r * 4 + i) * 32);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < kTiles; ++j) {
          const uint4 xv = load_shared16(sx + (i * kTokens + 8 * j + g) * 4 + t);  // token 8 j + g
#pragma unroll
          for (int h = 0; h < 2; ++h)
            mma_bf16(acc[j], word(ws[0][i], 2 * h), word(ws[1][i], 2 * h), word(ws[0][i], 2 * h + 1),
                     word(ws[1][i], 2 * h + 1), word(xv, 2 * h), word(xv, 2 * h + 1));
        }
    }
    if (now.chunk == count - 1) {
      // acc[j]: rows g (0, 1) and g + 8 (2, 3) of this warp's tile, tokens 8 j + 2 t (+1).
      float* part = partials + buffer * kBlockOutputs;
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        const int tok = 8 * j + 2 * t;
        const int row = 16 * warp + g;
        part[tok * kWarpCtaRows + row] = acc[j][0];
        part[(tok + 1) * kWarpCtaRows + row] = acc[j][1];
        part[tok * kWarpCtaRows + row + 8] = acc[j][2];
        part[(tok + 1) * kWarpCtaRows + row + 8] = acc[j][3];
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
      }
      finish_block(now.block, part);
      buffer ^= 1;
    }
    now.advance(count, step);
    stage = stage == kStages - 1 ? 0 : stage + 1;
  }
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  // Why: a rank's shared memory must stay alive until every peer has read it.
  if (split > 1) cluster.sync();
}

}  // namespace tpdecode::warp_splitk
