// The reference FP8 quantiser (reference/fp8_quant.hpp) on known values: e4m3's
// saturation at 448, subnormals, NaN, signed zero, ties to even, every code's round
// trip, a dense sweep against a nearest-value search, and the static and group
// epilogues' scales (FP32 and UE8M0) and values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "reference/fp8_quant.hpp"
#include "core/bf16.hpp"

namespace tpdecode::reference {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TEST(Fp8QuantReference, KnownE4m3Codes) {
  struct Case {
    float x;
    uint8_t bits;
  };
  const Case cases[] = {
      {0.0f, 0x00},          {-0.0f, 0x80},          {1.0f, 0x38},         {-1.0f, 0xb8},
      {448.0f, 0x7e},        {-448.0f, 0xfe},        {449.0f, 0x7e},       {464.0f, 0x7e},  // 464: the tie with 480 goes to 448
      {1e30f, 0x7e},         {kInf, 0x7e},           {-kInf, 0xfe},        {240.0f, 0x77},
      {0x1p-6f, 0x08},       {0x1p-9f, 0x01},        {-0x1p-9f, 0x81},     {7 * 0x1p-9f, 0x07},
      {0x1p-10f, 0x00},      {-0x1p-10f, 0x80},      // half the smallest subnormal: ties to 0 (even)
      {0x1.8p-10f, 0x01},    // above half of it: 1 unit
      {3 * 0x1p-10f, 0x02},  // 1.5 units: ties to 2 (even)
      {15 * 0x1p-10f, 0x08}, // 7.5 units: ties to 8, the smallest normal
      {1.0625f, 0x38},       // between 1.0 and 1.125: ties to the even mantissa 0
      {1.1875f, 0x3a},       // between 1.125 and 1.25: ties to the even mantissa 2
      {1.0626f, 0x39},       // just above the tie
      {15.5f, 0x58},         // between 15 (0x57) and 16 (0x58): ties to 16's even mantissa 0
      {1e-20f, 0x00},        {from_bits(0x00000001u), 0x00},  // an FP32 subnormal
  };
  for (const Case& c : cases) EXPECT_EQ(e4m3_from_float(c.x), c.bits) << c.x;
  EXPECT_EQ(e4m3_from_float(kNaN), 0x7f);
  EXPECT_EQ(e4m3_from_float(-kNaN), 0xff);
  EXPECT_EQ(e4m3_from_float(from_bits(0x7f800001u)), 0x7f);  // a signalling NaN
}

TEST(Fp8QuantReference, EveryCodeRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    const auto bits = static_cast<uint8_t>(b);
    const float v = float_from_e4m3(bits);
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << b;
      continue;
    }
    EXPECT_EQ(e4m3_from_float(v), bits) << b << " = " << v;
  }
  EXPECT_EQ(float_from_e4m3(0x7e), 448.0f);
  EXPECT_EQ(float_from_e4m3(0x01), 0x1p-9f);
  EXPECT_EQ(float_from_e4m3(0x08), 0x1p-6f);
}

// The nearest finite e4m3 value to |x| (ties: the even code), saturating at 448.
uint8_t nearest_code(float x) {
  const float a = std::fabs(x);
  uint8_t best = 0;
  for (int b = 1; b < 0x7f; ++b) {
    const float d = std::fabs(float_from_e4m3(static_cast<uint8_t>(b)) - a);
    const float dbest = std::fabs(float_from_e4m3(best) - a);
    if (d < dbest || (d == dbest && (b & 1) == 0)) best = static_cast<uint8_t>(b);
  }
  if (a > 448.0f) best = 0x7e;
  return static_cast<uint8_t>((std::signbit(x) ? 0x80 : 0) | best);
}

TEST(Fp8QuantReference, DenseSweepMatchesTheNearestValue) {
  // Every FP32 between 2^-12 and 2^10 on a grid of 2^-10 of each binade's ulps,
  // plus each e4m3 midpoint and its FP32 neighbours.
  int checked = 0;
  for (uint32_t u = 0x39800000u; u < 0x44800000u; u += 0x2000u, ++checked)
    for (float x : {from_bits(u), -from_bits(u)}) ASSERT_EQ(e4m3_from_float(x), nearest_code(x)) << x;
  for (int b = 0; b < 0x7e; ++b) {
    const float mid = (float_from_e4m3(static_cast<uint8_t>(b)) + float_from_e4m3(static_cast<uint8_t>(b + 1))) / 2;
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf)})
      ASSERT_EQ(e4m3_from_float(x), nearest_code(x)) << x;
  }
  EXPECT_GT(checked, 5000);
}

TEST(Fp8QuantReference, GroupScales) {
  EXPECT_EQ(group_scale(448.0f, false), 1.0f);
  EXPECT_EQ(group_scale(448.0f, true), 1.0f);
  EXPECT_EQ(group_scale(449.0f, false), 449.0f / 448.0f);
  EXPECT_EQ(group_scale(449.0f, true), 2.0f);
  EXPECT_EQ(group_scale(224.0f, true), 0.5f);
  EXPECT_EQ(group_scale(3.0f, true), 0x1p-7f);  // 3/448 = 0.0067: next power of two 2^-7 = 0.0078
  // A scale one ulp above a power of two goes to the next power of two.
  const float just_above = std::nextafter(0x1p-8f, 1.0f) * 448.0f;
  EXPECT_GT(group_scale(just_above, false), 0x1p-8f);
  EXPECT_EQ(group_scale(just_above, true), 0x1p-7f);
  // The floor: an all-zero group's scale is 1e-10 / 448 (UE8M0: 2^-42).
  EXPECT_EQ(group_scale(0.0f, false), 1e-10f / 448.0f);
  EXPECT_EQ(group_scale(0.0f, true), 0x1p-42f);
  EXPECT_EQ(group_scale(1e-12f, false), 1e-10f / 448.0f);
  EXPECT_TRUE(std::isnan(group_scale(kNaN, false)));
  EXPECT_TRUE(std::isnan(group_scale(kNaN, true)));
  EXPECT_EQ(group_scale(kInf, true), kInf);
}

std::vector<uint16_t> bf16_values(std::initializer_list<float> values, std::size_t n) {
  std::vector<uint16_t> v(n, bf16::from_float(0.0f));
  std::size_t i = 0;
  for (float f : values) v[i++] = bf16::from_float(f);
  return v;
}

TEST(Fp8QuantReference, GroupEpilogueScalesEachGroupOfOneHundredTwentyEight) {
  // Row 0: group 0 has amax 4.0 (scale 4/448), group 1 all zero; row 1 starts with a NaN.
  std::vector<uint16_t> v = bf16_values({4.0f, -2.0f, 1.0f, 0.0078125f}, 2 * 256);
  v[256] = bf16::from_float(kNaN);
  v[257] = bf16::from_float(3.0f);
  v[384] = bf16::from_float(-500.0f);
  for (bool ue8m0 : {false, true}) {
    const GroupQuant g = quantise_groups(v, 256, ue8m0);
    ASSERT_EQ(g.scales.size(), 4u);
    ASSERT_EQ(g.q.size(), v.size());
    const float s0 = ue8m0 ? 0x1p-6f : 4.0f / 448.0f;  // 4/448 = 0.0089: UE8M0 2^-6 = 0.0156
    EXPECT_EQ(g.scales[0], s0);
    EXPECT_EQ(g.scales[1], group_scale(0.0f, ue8m0));
    EXPECT_TRUE(std::isnan(g.scales[2]));  // the NaN poisons its group's scale and values
    EXPECT_EQ(g.scales[3], group_scale(500.0f, ue8m0));
    EXPECT_EQ(g.q[0], e4m3_from_float(4.0f / s0));
    EXPECT_EQ(g.q[0], ue8m0 ? 0x78 : 0x7e);  // 4 / 2^-6 = 256; 4 / (4/448) = 448
    EXPECT_EQ(g.q[1], e4m3_from_float(-2.0f / s0));
    EXPECT_EQ(g.q[3], e4m3_from_float(0.0078125f / s0));
    EXPECT_EQ(g.q[128], 0x00);
    EXPECT_EQ(g.q[256] & 0x7f, 0x7f);
    EXPECT_EQ(g.q[257] & 0x7f, 0x7f);
    EXPECT_EQ(g.q[384], ue8m0 ? 0xf8 : 0xfe);  // the group's amax: -500 / 2 = -250 -> -256; -500 / (500/448) -> -448
  }
  EXPECT_THROW(quantise_groups(v, 192, false), std::exception);
}

TEST(Fp8QuantReference, StaticEpilogueMultipliesByTheRoundedInverse) {
  const std::vector<uint16_t> v = bf16_values({1.0f, -3.0f, 1000.0f, kNaN, 0.001f}, 8);
  const float scale = 0.3f;
  const float inv = 1.0f / scale;
  const std::vector<uint8_t> q = quantise_static(v, scale);
  ASSERT_EQ(q.size(), v.size());
  EXPECT_EQ(q[0], e4m3_from_float(bf16::to_float(v[0]) * inv));
  EXPECT_EQ(q[1], e4m3_from_float(-3.0f * inv));
  EXPECT_EQ(q[2], 0x7e);  // 3333: saturated
  EXPECT_EQ(q[3], 0x7f);
  EXPECT_EQ(q[4], e4m3_from_float(bf16::to_float(v[4]) * inv));
}

}  // namespace
}  // namespace tpdecode::reference
