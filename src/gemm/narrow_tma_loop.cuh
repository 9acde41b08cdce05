// The one-tile narrow CTA's main loop with the weight by tensor-map boxes: each warp
// takes every fourth 128-column chunk of its CTA's K range (as the cp.async form),
// lane 0 loads the warp's [16 rows, 128] W slice with one box ([2][16][64], 128-byte
// swizzle) onto an mbarrier of the warp's stage, the lanes copy the x slice with
// cp.async, and mma.sync takes both operands from ldmatrix in the plain K order.
//
// Why: ncu put the cp.async form's CTA at one warp's issue rate (one warp per
// scheduler), ~300 instructions a 4 KB chunk, 8 of them W copies a lane; a box is
// one instruction of one lane, and ldmatrix gives a lane 4 MMA operands at once. At
// 4-8 rows it runs 6-17 % faster on the short-N weights (2112 x 7168, 1152 x 1536),
// at one row up to 3 % slower on long-K ones (docs/performance.md): both forms are
// tuner candidates.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "core/device.cuh"
#include "gemm/narrow_tma_layout.hpp"
#include "gemm/warp_splitk_launch.hpp"
#include "gemm/wgmma_ops.cuh"

namespace tpdecode::warp_splitk {

// acc[j]: rows g (0, 1) and g + 8 (2, 3) of the CTA's 16-row tile, tokens 8 j + 2 t
// (+1) (g = lane / 4, t = lane % 4): the cp.async form's layout, so both share the
// epilogue. `column(c)`: the first K column of the warp's c-th chunk. `ring`: the
// CTA's narrow_tma_ring_bytes at a 1024-byte aligned address (the swizzle's period).
// Weights are requested before griddepcontrol.wait, activations after it.
template <int kTiles, class Column, class AfterWait>
__device__ __forceinline__ void narrow_tma_loop(const WarpSplitKParams& p, const CUtensorMap* w_map, uint8_t* ring,
                                                int64_t tile_row, int count, Column&& column, AfterWait&& after_wait,
                                                float (&acc)[kTiles][4]) {
  constexpr int kTokens = 8 * kTiles;
  constexpr int kStages = kNarrowTmaStages;
  constexpr int kWStage = kWarpWarps * kWarpStageBytes;  // one stage of every warp's W
  constexpr int kXSlice = kTokens * kWarpChunkK * 2;     // one x slice: [tokens, 128] bf16
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  uint8_t* my_w = ring + warp * kWarpStageBytes;  // stage s at + s * kWStage
  uint8_t* my_x = ring + kStages * kWStage + warp * kStages * kXSlice;
  uint64_t* bar = reinterpret_cast<uint64_t*>(ring + kStages * kWStage + kWarpWarps * kStages * kXSlice) +
                  warp * kStages;
  auto slot_w = [&](int c) { return my_w + (c % kStages) * kWStage; };
  auto slot_x = [&](int c) { return my_x + (c % kStages) * kXSlice; };
  const uint64_t policy = dev::evict_first_policy();
  if (lane == 0) {
    for (int i = 0; i < kStages; ++i) dev::mbar_init(&bar[i], 1);
    dev::mbar_init_fence();
  }
  __syncwarp();
  auto issue_w = [&](int c) {
    if (lane != 0) return;
    uint64_t* b = &bar[c % kStages];
    dev::mbar_arrive_expect_tx(b, kWarpStageBytes);
    dev::tma_load_3d(slot_w(c), w_map, 0, static_cast<int>(tile_row), static_cast<int>(column(c) / 64), b, policy);
  };
  // x: lane copies piece lane % 16 (columns 8 (lane % 16) ..) of tokens lane / 16 + 2 i
  // (narrow_tma_layout.hpp: the pieces of a token row swizzled so that ldmatrix's 8
  // token rows at one piece fall in 8 different 16-byte bank groups).
  constexpr int kXCopies = kTokens / 2;
  const int x_token = lane / 16;
  const auto* x_lane = static_cast<const __nv_bfloat16*>(p.x) + x_token * p.k + 8 * (lane % 16);
  int x_at[4];  // x_offset(lane, i) = x_at[i % 4] + 512 i (a token's swizzle repeats every 4 copies)
#pragma unroll
  for (int i = 0; i < 4; ++i) x_at[i] = narrow_tma::x_offset(lane, i) - 512 * i;
  auto issue_x = [&](int c) {  // tokens >= m stay zero (set once below)
    const __nv_bfloat16* src = x_lane + column(c);
    uint8_t* sl = slot_x(c);
#pragma unroll
    for (int i = 0; i < kXCopies; ++i)
      if (x_token + 2 * i < p.m) dev::copy16_async(sl + 512 * i + x_at[i % 4], src + 2 * i * p.k);
  };
  // ldmatrix addresses (bytes into a stage), fixed per lane: A for k16 step s, B for
  // steps 2 q and 2 q + 1 (narrow_tma_layout.hpp).
  uint32_t a_at[8];
#pragma unroll
  for (int s = 0; s < 8; ++s) a_at[s] = narrow_tma::a_offset(lane, s);
  uint32_t b_at[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) b_at[q] = narrow_tma::b_offset(lane, q);

#pragma unroll
  for (int c = 0; c < kStages - 1; ++c)
    if (c < count) issue_w(c);
  for (int e = lane; e < kStages * kXSlice / 16; e += 32)
    if ((e % (kXSlice / 16)) / 16 >= p.m) reinterpret_cast<uint4*>(my_x)[e] = make_uint4(0, 0, 0, 0);
  dev::pdl_wait();
  for (int c = 0; c < kStages - 1 && c < count; ++c) issue_x(c);
  dev::copy_commit();
  after_wait();

  static_assert(kStages == 4, "the waits below count groups for a 4-stage ring");
  for (int c = 0; c < count; ++c) {
    // The refill of slot (c - 1) % 4, read in iteration c - 1, goes out before the
    // wait: 4 stages in flight while this warp waits for chunk c. Why the proxy fence:
    // the box overwrites what the lanes' ldmatrix read (generic proxy) through the
    // async proxy (measured 1-2 % faster than without it).
    __syncwarp();
    if (c + kStages - 1 < count) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      issue_w(c + kStages - 1);
      issue_x(c + kStages - 1);
    }
    dev::copy_commit();
    dev::copy_wait_ring4(c);  // chunk c's x (its W: the mbarrier below)
    dev::mbar_wait(&bar[c % kStages], (c / kStages) & 1);
    __syncwarp();  // the x pieces other lanes copied are visible
    const uint32_t sw = dev::shared_address(slot_w(c));
    const uint32_t sx = dev::shared_address(slot_x(c));
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t b[kTiles][4];  // steps 2 q (0, 1) and 2 q + 1 (2, 3) of tokens 8 j ..
#pragma unroll
      for (int j = 0; j < kTiles; ++j) dev::ldmatrix_x4(b[j], sx + j * 8 * narrow_tma::kXRowBytes + b_at[q]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t a[4];
        dev::ldmatrix_x4(a, sw + a_at[2 * q + h]);
#pragma unroll
        for (int j = 0; j < kTiles; ++j) dev::mma_bf16(acc[j], a[0], a[1], a[2], a[3], b[j][2 * h], b[j][2 * h + 1]);
      }
    }
  }
  dev::copy_wait<0>();
}

}  // namespace tpdecode::warp_splitk
