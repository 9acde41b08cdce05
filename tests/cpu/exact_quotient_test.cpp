// The per-group FP8 epilogue's quotient (core/exact_quotient.hpp) against the
// division it replaces, over its whole domain: every BF16 amax a group can have (its
// scale amax / 448 after the 1e-10 floor) and every BF16 value x with |x| <= amax.
// Its e4m3 code must equal the division's everywhere, its bits wherever
// |x / s| >= 2^-20 (below, both are e4m3 zeros of x's sign).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "core/bf16.hpp"
#include "core/exact_quotient.hpp"
#include "reference/fp8_quant.hpp"

namespace tpdecode {
namespace {

TEST(ExactQuotient, EqualsTheDivisionForEveryBf16ValueAndGroupScale) {
  int64_t checked = 0, tiny_bit_differences = 0;
  constexpr uint16_t kLargestFinite = 0x7f7f;
  for (uint32_t amax_bits = 0; amax_bits <= kLargestFinite; ++amax_bits) {
    const float s = reference::group_scale(bf16::to_float(static_cast<bf16::Bits>(amax_bits)), false);
    const float r = 1.0f / s;
    ASSERT_TRUE(std::isnormal(r)) << "scale " << s;
    for (uint32_t magnitude = 0; magnitude <= amax_bits; ++magnitude)
      for (uint32_t sign : {0u, 0x8000u}) {
        const float x = bf16::to_float(static_cast<bf16::Bits>(magnitude | sign));
        const float want = x / s, got = quotient_by_reciprocal(x, s, r);
        ++checked;
        if (bf16::bits_of_float(want) == bf16::bits_of_float(got)) continue;
        ASSERT_LT(std::fabs(want), 0x1p-20f) << x << " / " << s << ": " << got << " against " << want;
        ASSERT_EQ(reference::e4m3_from_float(got), reference::e4m3_from_float(want)) << x << " / " << s;
        ++tiny_bit_differences;
      }
  }
  EXPECT_EQ(checked, int64_t{kLargestFinite + 1} * (kLargestFinite + 2));
  RecordProperty("tiny_bit_differences", static_cast<int>(tiny_bit_differences));
}

TEST(ExactQuotient, KeepsTheSignOfZero) {
  EXPECT_TRUE(std::signbit(quotient_by_reciprocal(-0.0f, 3.0f, 1.0f / 3.0f)));
  EXPECT_FALSE(std::signbit(quotient_by_reciprocal(0.0f, 3.0f, 1.0f / 3.0f)));
}

}  // namespace
}  // namespace tpdecode
