// The store of a normalised row fragment (8 BF16 values, one thread's): as it is,
// or quantised to e4m3 with a static scale or one scale per 128 columns
// (ArNormQuant), in the norm's own kernel. The math is reference/fp8_quant.hpp's,
// value for value: the BF16 values quantised, 1 / scale and the group scale rounded
// once (__fdiv_rn), the products and quotients rounded once (a quotient by a finite
// group scale as Markstein's correction from its rounded reciprocal,
// core/exact_quotient.hpp: equal to the division, and cheaper), e4m3 by the
// hardware's cvt.rn.satfinite (round to nearest even, saturating, NaN kept).
//
// Geometry (row_norm.cuh): thread t of CTA c holds fragment c · H/64 + t of its
// row, so a group of 128 columns is 16 consecutive lanes of one warp when H is a
// multiple of 1024 (ar_norm_group_quant_served); its amax is a half-warp reduction.
// Threads past the row's fragments form whole 16-lane groups of their own.
#pragma once

#include <cuda_fp8.h>

#include "comm/kernels.hpp"
#include "comm/memory.hpp"
#include "core/bf16.hpp"
#include "core/exact_quotient.hpp"

namespace tpdecode::rowquant {

using lamport::Fragment;

inline constexpr int kGroupLanes = static_cast<int>(kArNormQuantGroup / 8);
static_assert(kGroupLanes == 16, "a group is half a warp");

// e4m3 of 8 FP32 values, value i in byte i.
__device__ __forceinline__ uint2 e4m3x8(const float (&v)[8]) {
  uint32_t half[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    half[j] = __nv_cvt_float2_to_fp8x2(make_float2(v[2 * j], v[2 * j + 1]), __NV_SATFINITE, __NV_E4M3);
  return make_uint2(half[0] | (half[1] << 16), half[2] | (half[3] << 16));
}

// The fragment's 8 values times m, each rounded once.
__device__ __forceinline__ uint2 scaled_e4m3(const Fragment& f, float m) {
  float v[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[2 * j] = __fmul_rn(bf16::low_of(f.w[j]), m);
    v[2 * j + 1] = __fmul_rn(bf16::high_of(f.w[j]), m);
  }
  return e4m3x8(v);
}

// The fragment's 8 values divided by a group scale s, each rounded once: from its
// rounded reciprocal while s is finite (the division's bits, cheaper), by division
// otherwise (an infinite or NaN amax).
__device__ __forceinline__ uint2 divided_e4m3(const Fragment& f, float s) {
  float v[8];
  if (isfinite(s)) {
    const float r = __frcp_rn(s);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[2 * j] = quotient_by_reciprocal(bf16::low_of(f.w[j]), s, r);
      v[2 * j + 1] = quotient_by_reciprocal(bf16::high_of(f.w[j]), s, r);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[2 * j] = __fdiv_rn(bf16::low_of(f.w[j]), s);
      v[2 * j + 1] = __fdiv_rn(bf16::high_of(f.w[j]), s);
    }
  }
  return e4m3x8(v);
}

// The largest |v| of the 16 lanes' fragments, as BF16 bits: an integer maximum of
// the magnitudes' bits (ordered as the values; a NaN's bits exceed every other).
__device__ __forceinline__ float group_amax(const Fragment& f) {
  uint32_t m = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) m = max(m, max(f.w[j] & 0x7fffu, (f.w[j] >> 16) & 0x7fffu));
  // Two independent warp reductions (redux.sync) rather than a 4-step butterfly:
  // each half's lanes see the other half as 0, below every magnitude.
  const bool low = threadIdx.x % 32 < kGroupLanes;
  const uint32_t lo = __reduce_max_sync(0xffffffffu, low ? m : 0u);
  const uint32_t hi = __reduce_max_sync(0xffffffffu, low ? 0u : m);
  return bf16::to_float(static_cast<bf16::Bits>(low ? lo : hi));
}

// max(amax, 1e-10) / 448 (a NaN kept), and for UE8M0 the smallest power of two at
// or above it: the exponent raised by one unless the mantissa is zero (the floor
// keeps the scale a normal float; infinities and NaN stay).
__device__ __forceinline__ float group_scale(float amax, bool ue8m0) {
  const float scale = __fdiv_rn(amax < 1e-10f ? 1e-10f : amax, 448.0f);
  uint32_t b = __float_as_uint(scale);
  if (ue8m0 && (b & 0x007fffffu) != 0 && (b & 0x7f800000u) != 0x7f800000u) b = (b & 0x7f800000u) + 0x00800000u;
  return __uint_as_float(b);
}

// The store of one row's normalised fragments, per thread.
// kQuantized false: a store that never quantises (q.kind must be kNone), for
// kernels whose callers never ask for FP8. Why: the quantising branches cost the
// kernel registers even where they never run (the o-projection's consumer: 90 ->
// 109 per thread, one resident CTA per SM fewer).
template <bool kQuantized = true>
struct RowStore {
  const RowQuant& q;
  float inverse = 0.0f;  // kStatic: 1 / scale

  // After griddepcontrol.wait (a scale is an input like any other).
  __device__ __forceinline__ void load() {
    if constexpr (kQuantized)
      if (q.kind == ArNormQuant::kStatic) inverse = __fdiv_rn(1.0f, *q.scale);
  }

  // Every thread of the CTA (the group amax is a warp reduction); `at`: the
  // fragment's index in [rows, H / 8]; only `active` threads store.
  __device__ __forceinline__ void store(void* out, long at, const Fragment& v, bool active) const {
    if constexpr (!kQuantized) {
      if (active) static_cast<Fragment*>(out)[at] = v;
      return;
    }
    switch (q.kind) {
      case ArNormQuant::kNone:
        if (active) static_cast<Fragment*>(out)[at] = v;
        return;
      case ArNormQuant::kStatic:
        if (active) static_cast<uint2*>(out)[at] = scaled_e4m3(v, inverse);
        return;
      case ArNormQuant::kGroup:
      case ArNormQuant::kGroupUe8m0: {
        const bool ue8m0 = q.kind == ArNormQuant::kGroupUe8m0;
        const float scale = group_scale(group_amax(v), ue8m0);
        if (!active) return;
        // Why a product for UE8M0: dividing by a power of two and multiplying by its
        // reciprocal (exact) round the same real number, and the product is cheaper.
        static_cast<uint2*>(out)[at] =
            ue8m0 ? scaled_e4m3(v, __frcp_rn(scale)) : divided_e4m3(v, scale);
        if (threadIdx.x % kGroupLanes == 0) q.scale[at / kGroupLanes] = scale;
        return;
      }
    }
  }
};

}  // namespace tpdecode::rowquant
