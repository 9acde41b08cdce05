// Exact BF16 arithmetic on the host: the conversions and roundings the kernels
// perform, bit for bit. The base of every exactness test.
#pragma once

#include <bit>
#include <cstdint>
#include <span>

namespace tpdecode::bf16 {

using Bits = uint16_t;

inline float to_float(Bits b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// Round to nearest, ties to even; NaN stays NaN (quiet), infinities stay.
inline Bits from_float(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<Bits>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<Bits>(u >> 16);
}

// Two BF16 values in one 32-bit word: `lo` at the lower address.
inline uint32_t pack(Bits lo, Bits hi) { return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16); }

// 1 BF16 ulp distance in the total order of finite values (sign-magnitude aware).
int ulp_distance(Bits a, Bits b);

// The all-reduce contract: partials[r][i] summed in FP32 in rank order 0..R-1,
// rounded once. `out` may alias nothing.
void reduce_rank_order(std::span<const Bits* const> partials, std::span<Bits> out);

}  // namespace tpdecode::bf16
