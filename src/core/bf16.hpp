// Exact BF16 arithmetic, the same bits on host and device: the conversions and the
// one rounding every kernel performs, and the host reference helpers built on them.
// A BF16 pair packed in a 32-bit word keeps the value at the lower address in the
// low half.
#pragma once

#include <cstdint>
#include <span>

#if defined(__CUDACC__)
#define TPD_HD __host__ __device__ __forceinline__
#else
#define TPD_HD inline
#endif

namespace tpdecode::bf16 {

using Bits = uint16_t;

TPD_HD float float_of_bits(uint32_t u) { return __builtin_bit_cast(float, u); }
TPD_HD uint32_t bits_of_float(float f) { return __builtin_bit_cast(uint32_t, f); }

TPD_HD float to_float(Bits b) { return float_of_bits(static_cast<uint32_t>(b) << 16); }
// The value at the lower / higher address of a packed pair.
TPD_HD float low_of(uint32_t word) { return float_of_bits(word << 16); }
TPD_HD float high_of(uint32_t word) { return float_of_bits(word & 0xffff0000u); }

// Round to nearest, ties to even; NaN stays NaN (quiet), infinities stay.
TPD_HD Bits from_float(float f) {
  const uint32_t u = bits_of_float(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<Bits>((u >> 16) | 0x0040u);
  return static_cast<Bits>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

TPD_HD uint32_t pack(Bits lo, Bits hi) { return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16); }
// Two FP32 values rounded once each and packed.
TPD_HD uint32_t pack_rounded(float lo, float hi) { return pack(from_float(lo), from_float(hi)); }

inline constexpr Bits kQuietNaN = 0x7fc0;  // what a poisoned output holds

// 1 BF16 ulp distance in the total order of finite values (sign-magnitude aware).
int ulp_distance(Bits a, Bits b);

// The all-reduce contract: partials[r][i] summed in FP32 in rank order 0..R-1,
// rounded once. `out` may alias nothing.
void reduce_rank_order(std::span<const Bits* const> partials, std::span<Bits> out);

}  // namespace tpdecode::bf16
