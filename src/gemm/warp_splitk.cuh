// The warp split-K engine: out[M, N] = x[M, K] * W[N, K]^T for M <= 64 (1, 2, 4 or
// 8 token tiles of 8 rows).
//
// The wide CTA owns 64 rows of W (one 16-row tile per warp) and 1/split of K,
// streamed in 128-column chunks through a 4-stage cp.async ring (all 4 in flight
// while a warp waits): each warp copies its own [16, 128] W slice, two whole
// 256-byte rows per instruction, the CTA copies the [M, 128] activation slice once
// for its four warps (so x is read from L2 once per 64 weight rows, not once per
// 16). The narrow CTAs (up to 16 rows) own one or two 16-row tiles: with one, warp w
// takes chunks w, w + 4, ... of the CTA's K range with its own x slices; with two,
// warps 2 q and 2 q + 1 (tiles 0 and 1) take chunks q, q + 2, ... with one x slice
// (each group's walk over its chunks starts at one rotated by the row block); the
// groups' sums are added in group order. The one-tile CTA has a second form, its
// weight by tensor-map boxes and its fragments by ldmatrix (narrow_tma_loop.cuh).
// mma.sync m16n8k16 runs with W's rows on the 16-wide (A) side and the tokens on the
// 8-wide (B) side. The split-K partials (FP32) of one
// row block are summed over its `split` CTAs, ranks 0..split-1 in that order,
// through distributed shared memory (the CTAs of a block are consecutive ranks of
// one cluster), each CTA summing 1/split of the outputs; one BF16 rounding. No
// atomics: bitwise identical from run to run, and a row's sum does not depend on M.
//
// The engine's own kernel: grid (split, blocks), clusters of `split` CTAs along x.
// Other kernels run a CTA of the engine through run_cta() with their own epilogue
// (the o-projection pushes its rounded outputs into peers' mailboxes).
//
// K permutation: each lane multiplies the 16-byte pieces at columns 32 i + 8 t of W
// rows g and g + 8 and of token g (dev::mma_bf16_piece). Its W pieces are copied by
// other lanes (w_piece_slot), since a warp reading 8 rows x 64 B per instruction
// streams 2-7 % slower than one reading 2 rows x 256 B (tpdecode bench loads).
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda/ptx>

#include <cstdint>

#include "core/device.cuh"
#include "gemm/narrow_tma_loop.cuh"
#include "gemm/warp_splitk_launch.hpp"

namespace tpdecode::warp_splitk {

namespace cg = cooperative_groups;

inline constexpr int kThreads = kWarpWarps * 32;
inline constexpr int kWPieces = 8;  // 16-byte W pieces per lane and stage: 2 rows x 4

// Where, in a warp's stage of W ([8 pieces, 32 lanes] x 16 B, piece r * 4 + i of
// lane 4 g + t = row g + 8 r, columns 32 i + 8 t), copy j (0..7) of `lane` goes: the
// warp's copy j reads row 2 j + lane / 16, columns 8 (lane % 16) .. + 7 (two whole
// rows). Why the XOR by 4 i: the 8 lanes of each quarter of the copy then store into
// 8 different 16-byte bank groups; the reading lane applies the same XOR.
__device__ __forceinline__ int w_piece_slot(int j, int lane) {
  const int row = 2 * j + lane / 16;  // 0..15
  const int col16 = lane % 16;        // = 4 i + t
  const int i = col16 / 4;
  const int owner = 4 * (row % 8) + col16 % 4;
  return ((row / 8) * 4 + i) * 32 + (owner ^ (4 * i));
}

// Where a CTA of the engine sits: its block of W (16 kRowTiles rows), its rank
// among the `split` CTAs of that block (each a K range) and the cluster rank of the
// first of them (the block's CTAs are cluster ranks base .. base + split - 1).
struct Slot {
  int64_t block;
  int rank;
  int split;
  int cluster_base;
};

// One CTA of the engine (every thread of the CTA calls it; kThreads threads;
// warp_smem_bytes(kTiles, kRowTiles, kTensorMap) of dynamic shared memory at `smem`,
// 1024-byte aligned for the tensor-map form).
//  - kRowTiles: 16-row tiles of W per CTA, 4 (the wide CTA), 2 or 1 (narrow ones).
//  - kTensorMap: the one-tile CTA's tensor-map form (narrow_tma_loop.cuh; w_map its
//    boxes); w_map is not read otherwise.
//  - after_wait(): every thread, right after griddepcontrol.wait and the first
//    activation copies (the weights' are in flight since before the wait).
//  - epilogue(token, column, v): once per output unit of kCols consecutive columns
//    of one token (v[c] is column `column + c`; column in [0, N) rounded down to
//    kCols, token < 8 kTiles), for the first `units` units of the block in
//    (token, column) order, spread over the block's CTAs. Every CTA of the cluster
//    passes the same number of cluster barriers, whatever its epilogue does.
template <int kTiles, int kCols, int kRowTiles = kWarpWarps, bool kTensorMap = false, class AfterWait, class Epilogue>
__device__ __forceinline__ void run_cta(const WarpSplitKParams& p, const Slot& s, uint8_t* smem, int units,
                                        const CUtensorMap* w_map, AfterWait&& after_wait, Epilogue&& epilogue) {
  static_assert(kRowTiles == kWarpWarps || kRowTiles == 2 || kRowTiles == 1, "a wide or a narrow CTA");
  static_assert(!kTensorMap || kRowTiles == 1, "the tensor-map form is the one-tile CTA's");
  constexpr int kTokens = 8 * kTiles;
  constexpr int kXPieces = kTokens * 16;  // 16-byte pieces of one [tokens, 128] x slice
  constexpr int kCtaRows = 16 * kRowTiles;
  constexpr int kGroups = kWarpWarps / kRowTiles;  // warps along K, each with its own x ring
  constexpr int kGroupThreads = 32 * kRowTiles;    // the threads that share one x slice
  static_assert(kCtaRows % kCols == 0, "a unit never straddles a block");
  uint4* ring_w = reinterpret_cast<uint4*>(smem);               // [stages, warps, 8 pieces, 32 lanes] x 16 B
  uint4* ring_x = ring_w + kWarpStages * kWarpWarps * kWPieces * 32;  // [groups, stages, 4 i, tokens, 4 t] x 16 B
  float* partials = kTensorMap ? reinterpret_cast<float*>(smem + narrow_tma_ring_bytes(kTiles))
                               : reinterpret_cast<float*>(ring_x + kGroups * kWarpStages * kXPieces);  // [groups, tokens, rows]

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  // Why not warp % kRowTiles and the like: spelled so, the wide CTA's constants
  // stay constants (a live group index cost its kernels registers and a spill).
  const int row_tile = kRowTiles == 1 ? 0 : kGroups == 1 ? warp : warp % kRowTiles;
  const int group = kGroups == 1 ? 0 : kRowTiles == 1 ? warp : warp / kRowTiles;
  const int gtid = kGroups == 1 ? tid : tid % kGroupThreads;  // the thread's index among those sharing its x slice
  const int c_begin = static_cast<int>(static_cast<int64_t>(p.chunks) * s.rank / s.split);
  const int cta_count = static_cast<int>(static_cast<int64_t>(p.chunks) * (s.rank + 1) / s.split) - c_begin;
  const int count = warp_group_chunks(cta_count, group, kGroups);  // chunks c_begin + group + kGroups c
  const int64_t cta_row = s.block * kCtaRows;
  const int64_t tile_row = cta_row + 16 * row_tile;
  const bool active = tile_row < p.n;  // the last wide CTA may hold fewer than 4 tiles

  const auto* w = static_cast<const __nv_bfloat16*>(p.w);
  const auto* x = static_cast<const __nv_bfloat16*>(p.x);
  // Why every lane's shared-memory slots and source offsets are computed once here:
  // with one warp per scheduler the CTA runs at one warp's issue rate, and the copies'
  // address arithmetic was most of a chunk's instructions (ncu: ~300 per 4 KB chunk).
  // W copy j of a lane goes to w_slot[j % 4] + 128 (j / 4) of its warp's stage (rows
  // 2 j + 8 and 2 j are 8 rows apart: one piece row of 4 x 32 further).
  const __nv_bfloat16* w_lane = w + (tile_row + lane / 16) * p.k + 8 * (lane % 16);  // copy 0's piece
  int w_slot[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) w_slot[j] = w_piece_slot(j, lane);
  // x piece q = gtid + kGroupThreads i of a slice is token gtid / 16 + kXTokenStep i,
  // columns 8 (gtid % 16) ..: a thread's copies step by whole token rows.
  constexpr int kXCopies = kXPieces / kGroupThreads;
  constexpr int kXTokenStep = kGroupThreads / 16;
  static_assert(kXPieces % kGroupThreads == 0, "every thread copies the same number of x pieces");
  const int x_token = gtid / 16;
  const __nv_bfloat16* x_thread = x + x_token * p.k + 8 * (gtid % 16);
  const int x_slot = ((gtid % 16) / 4 * kTokens + x_token) * 4 + gtid % 4;
  uint4* my_ring = ring_w + warp * kWPieces * 32;
  uint4* group_ring_x = ring_x + group * kWarpStages * kXPieces;
  const uint64_t policy = dev::evict_first_policy();
  // Why a group barrier for the narrow CTAs: each group reads only what it copied
  // (named barriers 1 and 2 for the two-tile CTA's pairs of warps).
  auto group_sync = [&] {
    if constexpr (kGroups == 1)
      __syncthreads();
    else if constexpr (kRowTiles == 1)
      __syncwarp();
    else
      asm volatile("bar.sync %0, %1;" ::"r"(1 + group), "n"(kGroupThreads) : "memory");
  };
  // Why the narrow CTAs start their K walks at a chunk rotated by row block: with
  // every one walking from its first chunk, the 1-2 x 66-132 CTAs of a short-N weight
  // read the same activation lines from L2 at the same moment (rotated: 7168 x 1536
  // 2.7-5 % faster at M 1-8, 1792 x 35840 at M 8 2.7 %; the wide CTA, whose blocks
  // read x once per 64 rows, lost up to 2.8 % and walks in order). The order depends
  // on the block, not on M: the bits are the same at every row count.
  const int rotation = kRowTiles < kWarpWarps ? walk_rotation(s.block, count) : 0;
  auto column = [&](int c) {
    const int r = kRowTiles < kWarpWarps ? rotated_chunk(c, rotation, count) : c;
    return static_cast<int64_t>(c_begin + group + kGroups * r) * kWarpChunkK;
  };
  auto slot_w = [&](int c) { return my_ring + (c % kWarpStages) * kWarpWarps * kWPieces * 32; };
  auto slot_x = [&](int c) { return group_ring_x + (c % kWarpStages) * kXPieces; };
  auto issue_w = [&](int c) {
    if (!active) return;
    const __nv_bfloat16* src = w_lane + column(c);
    uint4* sl = slot_w(c);
#pragma unroll
    for (int j = 0; j < kWPieces; ++j) dev::copy16_async(sl + w_slot[j % 4] + 128 * (j / 4), src + 2 * j * p.k, policy);
  };
  auto issue_x = [&](int c) {  // rows >= m stay zero (set once below)
    const __nv_bfloat16* src = x_thread + column(c);
    uint4* sl = slot_x(c) + x_slot;
#pragma unroll
    for (int i = 0; i < kXCopies; ++i)
      if (x_token + kXTokenStep * i < p.m) dev::copy16_async(sl + 4 * kXTokenStep * i, src + kXTokenStep * i * p.k);
  };

  float acc[kTiles][4] = {};
  if constexpr (kTensorMap) {
    narrow_tma_loop<kTiles>(p, w_map, smem, tile_row, count, column, after_wait, acc);
  } else {
    // Why: the weights do not depend on the previous kernel, so their copies start
    // before the grid-dependency wait; the activations are read only after it.
#pragma unroll
    for (int c = 0; c < kWarpStages - 1; ++c) {
      if (c < count) issue_w(c);
      dev::copy_commit();
    }
    for (int q = gtid; q < kWarpStages * kXPieces; q += kGroupThreads)
      if ((q % kXPieces) / 4 % kTokens >= p.m) group_ring_x[q] = make_uint4(0, 0, 0, 0);
    dev::pdl_wait();
    for (int c = 0; c < kWarpStages - 1 && c < count; ++c) issue_x(c);
    dev::copy_commit();
    after_wait();

    static_assert(kWarpStages == 4, "the waits below count groups for a 4-stage ring");
    for (int c = 0; c < count; ++c) {
      // Why: the refill goes out before the wait, so all 4 stages are in flight while
      // this warp waits for chunk c. Its slot, (c - 1) % 4, was read in iteration c - 1.
      group_sync();
      if (c + kWarpStages - 1 < count) {
        issue_w(c + kWarpStages - 1);
        issue_x(c + kWarpStages - 1);
      }
      dev::copy_commit();
      // Groups so far: W 0, W 1, W 2, X 0-2 (prologue), then one per iteration: chunk c
      // is in the prologue (whose last group is X 0-2) or in iteration c - 3's group.
      dev::copy_wait_ring4(c);
      group_sync();  // chunk c's x, copied by other threads, is visible
      const uint4* sw = slot_w(c);
      const uint4* sx = slot_x(c);
      uint4 ws[2][4];  // rows g, g + 8; columns 32 i + 8 t
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) ws[r][i] = dev::load_shared16(sw + (r * 4 + i) * 32 + (lane ^ (4 * i)));
      if (!active) continue;
      // Why the x pieces of column group i + 1 are loaded before group i's MMAs: the
      // loads are ordered as written, and an MMA right behind its own load waits for it.
      uint4 xs[kTiles];  // token 8 j + g, columns 32 i + 8 t
#pragma unroll
      for (int j = 0; j < kTiles; ++j) xs[j] = dev::load_shared16(sx + (8 * j) * 4 + lane);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint4 next[kTiles];
        if (i + 1 < 4) {
#pragma unroll
          for (int j = 0; j < kTiles; ++j) next[j] = dev::load_shared16(sx + ((i + 1) * kTokens + 8 * j) * 4 + lane);
        }
#pragma unroll
        for (int j = 0; j < kTiles; ++j) dev::mma_bf16_piece(acc[j], ws[0][i], ws[1][i], xs[j]);
        if (i + 1 < 4) {
#pragma unroll
          for (int j = 0; j < kTiles; ++j) xs[j] = next[j];
        }
      }
    }
    dev::copy_wait<0>();
  }

  // acc[j]: rows g (0, 1) and g + 8 (2, 3) of this warp's tile, tokens 8 j + 2 t (+1).
  float* my_partials = partials + group * kTokens * kCtaRows;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int tok = 8 * j + 2 * t;
    const int row = 16 * row_tile + g;
    my_partials[tok * kCtaRows + row] = acc[j][0];
    my_partials[(tok + 1) * kCtaRows + row] = acc[j][1];
    my_partials[tok * kCtaRows + row + 8] = acc[j][2];
    my_partials[(tok + 1) * kCtaRows + row + 8] = acc[j][3];
  }
  if constexpr (kGroups > 1) {
    // A narrow CTA's group sums, added in group order into group 0's partials (each
    // thread reads and writes its own elements).
    __syncthreads();
    for (int e = tid; e < kTokens * kCtaRows; e += kThreads) {
      float sum = partials[e];
#pragma unroll
      for (int q = 1; q < kGroups; ++q) sum += partials[q * kTokens * kCtaRows + e];
      partials[e] = sum;
    }
  }
  // Each CTA sums its 1/split of the units over ranks 0, 1, ..., split-1 in that
  // order (reading its peers' partials through distributed shared memory); unit u
  // is elements u·kCols .. u·kCols + kCols - 1 of [tokens, CTA rows], consecutive
  // threads taking consecutive units.
  const int u_begin = static_cast<int>(static_cast<int64_t>(units) * s.rank / s.split);
  const int u_end = static_cast<int>(static_cast<int64_t>(units) * (s.rank + 1) / s.split);
  if (s.split == 1) {
    __syncthreads();
    for (int u = u_begin + tid; u < u_end; u += kThreads) {
      float v[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) v[c] = partials[u * kCols + c];
      epilogue((u * kCols) / kCtaRows, cta_row + (u * kCols) % kCtaRows, v);
    }
    return;
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  for (int u = u_begin + tid; u < u_end; u += kThreads) {
    float v[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int e = u * kCols + c;
      float part[kWarpMaxSplit];
#pragma unroll
      for (int r = 0; r < kWarpMaxSplit; ++r)
        part[r] = r < s.split ? cluster.map_shared_rank(partials, s.cluster_base + r)[e] : 0.0f;
      float sum = part[0];
#pragma unroll
      for (int r = 1; r < kWarpMaxSplit; ++r)
        if (r < s.split) sum += part[r];
      v[c] = sum;
      // Element e is one of this CTA's units, read by this CTA alone: a store that
      // can issue only once every peer's value of it has returned.
      partials[e] = sum;
    }
    epilogue((u * kCols) / kCtaRows, cta_row + (u * kCols) % kCtaRows, v);
  }
  // Why: a CTA's shared memory must stay alive until every peer has read it. Why a
  // relaxed arrival: a release one waits for the thread's outstanding global
  // stores (its outputs, a producer's NVLink pushes) before the CTA may leave (the
  // TP 8 chain: 2-3 % faster); this thread's reads of its peers have returned
  // before it all the same, since the stores of their sums above precede it.
  dev::cluster_arrive_relaxed();
  cuda::ptx::barrier_cluster_wait();
}

template <int kTiles, int kRowTiles, bool kTensorMap>
__global__ void __launch_bounds__(kThreads) warp_splitk_kernel(const WarpSplitKParams p,
                                                                const __grid_constant__ CUtensorMap w_map) {
  extern __shared__ __align__(16) uint8_t smem_base[];
  uint8_t* smem = kTensorMap ? smem_base + ((1024 - (dev::shared_address(smem_base) & 1023)) & 1023) : smem_base;
  // Why: the next kernel in the stream may launch as soon as every CTA of this one
  // runs, so its weight prefetch overlaps this kernel's tail (it reads this
  // kernel's output only after its own griddepcontrol.wait, which waits for all of
  // this grid to complete).
  dev::pdl_launch_dependents();
  const Slot s{static_cast<int64_t>(blockIdx.y), static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x), 0};
  auto* out = static_cast<__nv_bfloat16*>(p.out);
  run_cta<kTiles, 1, kRowTiles, kTensorMap>(
      p, s, smem, 8 * kTiles * 16 * kRowTiles, &w_map, [] {},
      [&](int tok, int64_t col, const float (&v)[1]) {  // consecutive threads, consecutive columns
        if (tok < p.m && col < p.n) out[tok * p.out_stride + col] = __float2bfloat16_rn(v[0]);
      });
}

}  // namespace tpdecode::warp_splitk
