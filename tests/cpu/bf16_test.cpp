// The exact BF16 reference math against known bit patterns.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/bf16.hpp"

namespace tpdecode {
namespace {

TEST(Bf16, ConvertsKnownValues) {
  EXPECT_EQ(bf16::from_float(1.0f), 0x3f80);
  EXPECT_EQ(bf16::from_float(-2.0f), 0xc000);
  EXPECT_EQ(bf16::from_float(0.0f), 0x0000);
  EXPECT_EQ(bf16::from_float(-0.0f), 0x8000);
  EXPECT_EQ(bf16::from_float(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(bf16::to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16::to_float(0xc049), -3.140625f);
}

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 is exactly half-way between 1.0 (0x3f80, even) and 1.0078125 (0x3f81).
  EXPECT_EQ(bf16::from_float(std::bit_cast<float>(0x3f808000u)), 0x3f80);
  // 1.0078125 + 2^-8 is half-way between 0x3f81 (odd) and 0x3f82 (even): up.
  EXPECT_EQ(bf16::from_float(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  // Just above half-way rounds up; just below rounds down.
  EXPECT_EQ(bf16::from_float(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_EQ(bf16::from_float(std::bit_cast<float>(0x3f807fffu)), 0x3f80);
  // Rounding carries into the exponent; the largest finite rounds to infinity.
  EXPECT_EQ(bf16::from_float(std::bit_cast<float>(0x3fffffffu)), 0x4000);
  EXPECT_EQ(bf16::from_float(std::bit_cast<float>(0x7f7fffffu)), 0x7f80);
}

TEST(Bf16, NanStaysQuietNan) {
  const uint16_t b = bf16::from_float(std::bit_cast<float>(0x7f800001u));  // signalling NaN, low payload
  EXPECT_TRUE(std::isnan(bf16::to_float(b)));
  EXPECT_EQ(b & 0x0040, 0x0040);
}

TEST(Bf16, PairsPackLowAddressLow) {
  // The kernels' packed pairs: the lower address in the low half, each rounded once.
  EXPECT_EQ(bf16::pack_rounded(1.0f, -2.0f), 0xC0003F80u);
  EXPECT_EQ(bf16::low_of(0xC0003F80u), 1.0f);
  EXPECT_EQ(bf16::high_of(0xC0003F80u), -2.0f);
  EXPECT_EQ(bf16::pack_rounded(std::bit_cast<float>(0x3f808000u), 0.0f), 0x3f80u);  // a tie rounds to even
}

TEST(Bf16, UlpDistance) {
  EXPECT_EQ(bf16::ulp_distance(0x3f80, 0x3f80), 0);
  EXPECT_EQ(bf16::ulp_distance(0x3f80, 0x3f81), 1);
  EXPECT_EQ(bf16::ulp_distance(0x0000, 0x8000), 0);  // +0 and -0
  EXPECT_EQ(bf16::ulp_distance(0x0001, 0x8001), 2);  // smallest subnormals of both signs
}

TEST(Bf16, RankOrderSumRoundsOnce) {
  // 1 + 2^-9 + 2^-9: in FP32 the sum is exact (1 + 2^-8) and rounds once to even
  // (1.0); rounding after each add would also give 1.0, so use three terms where
  // the orders differ: 1 + 2^-8 (half-way) + 2^-16 -> above half-way -> 0x3f81.
  const std::vector<uint16_t> a = {0x3f80}, b = {0x3b80}, c = {0x3780};  // 1, 2^-8, 2^-16
  const uint16_t* parts[] = {a.data(), b.data(), c.data()};
  std::vector<uint16_t> out(1);
  bf16::reduce_rank_order(parts, out);
  EXPECT_EQ(out[0], 0x3f81);
  // Per-step rounding would give 1 + 2^-8 -> 0x3f80, then + 2^-16 -> 0x3f80.
  EXPECT_EQ(bf16::from_float(bf16::to_float(bf16::from_float(1.0f + 0x1p-8f)) + 0x1p-16f), 0x3f80);
}

TEST(Bf16, RankOrderMatters) {
  // FP32 addition is not associative: (big + small) - big != small - big + big.
  const std::vector<uint16_t> big = {0x4b80}, small = {0x3f80}, minus_big = {0xcb80};  // 2^24, 1, -2^24
  std::vector<uint16_t> out(1);
  const uint16_t* order1[] = {big.data(), small.data(), minus_big.data()};
  bf16::reduce_rank_order(order1, out);
  EXPECT_EQ(out[0], 0x0000);  // 2^24 + 1 rounds to 2^24 in FP32
  const uint16_t* order2[] = {big.data(), minus_big.data(), small.data()};
  bf16::reduce_rank_order(order2, out);
  EXPECT_EQ(out[0], 0x3f80);
}

}  // namespace
}  // namespace tpdecode
