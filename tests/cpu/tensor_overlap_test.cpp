// Whether two views share memory (core/tensor_overlap.hpp), against a byte-by-byte
// count on small fake layouts, and the refusal that names both views.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <string>

#include "core/tensor_overlap.hpp"

namespace tpdecode {
namespace {

TensorView at(int64_t byte, DType dtype, int64_t rows, int64_t cols, int64_t stride) {
  return {reinterpret_cast<void*>(static_cast<uintptr_t>(0x100000 + byte)), dtype, rows, cols, stride};
}

bool shares_a_byte(const TensorView& a, const TensorView& b) {
  auto bytes = [](const TensorView& t) {
    std::set<uintptr_t> s;
    const auto base = reinterpret_cast<uintptr_t>(t.data);
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t c = 0; c < t.cols * static_cast<int64_t>(t.element_size()); ++c)
        s.insert(base + static_cast<uintptr_t>(r * t.row_stride * static_cast<int64_t>(t.element_size()) + c));
    return s;
  };
  const std::set<uintptr_t> sa = bytes(a);
  for (uintptr_t x : bytes(b))
    if (sa.count(x)) return true;
  return false;
}

TEST(TensorOverlap, OneStrideIsExactAndOtherStridesAreCoarse) {
  std::mt19937 rng(7);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int disjoint_windows = 0;
  for (int i = 0; i < 20000; ++i) {
    const DType dtype = pick(0, 1) ? DType::kBF16 : DType::kF32;
    const int64_t stride = pick(1, 12);
    const TensorView a = at(pick(0, 200), dtype, pick(1, 5), pick(1, static_cast<int>(stride)), stride);
    const bool same_stride = pick(0, 3) != 0;
    const int64_t stride_b = same_stride ? stride : pick(1, 12);
    const TensorView b = at(pick(0, 200), dtype, pick(1, 5), pick(1, static_cast<int>(stride_b)), stride_b);
    const bool truth = shares_a_byte(a, b);
    const bool got = views_overlap(a, b);
    ASSERT_EQ(got, views_overlap(b, a));
    if (same_stride) {
      ASSERT_EQ(got, truth) << a.describe() << " at " << a.data << ", " << b.describe() << " at " << b.data;
      disjoint_windows += !truth && a.rows > 1 && b.rows > 1;
    } else {
      ASSERT_TRUE(got || !truth) << "a shared byte missed";
    }
  }
  EXPECT_GT(disjoint_windows, 100) << "the random layouts exercise interleaved disjoint rows";
  // Column windows of one [4, 128] bf16 buffer: [0, 64) and [64, 128) do not meet.
  EXPECT_FALSE(views_overlap(at(0, DType::kBF16, 4, 64, 128), at(128, DType::kBF16, 4, 64, 128)));
  EXPECT_TRUE(views_overlap(at(0, DType::kBF16, 4, 65, 128), at(128, DType::kBF16, 4, 64, 128)));
  EXPECT_FALSE(views_overlap({}, at(0, DType::kBF16, 4, 64, 128)));
}

TEST(TensorOverlap, TheRefusalNamesBothViewsAndTakesTheSameViewWhereAsked) {
  const TensorView x = at(0, DType::kBF16, 2, 64, 64);
  const TensorView shifted = at(16, DType::kBF16, 2, 64, 64);
  EXPECT_NO_THROW(check_apart("op", x, "out", x, "x", true));
  EXPECT_THROW(check_apart("op", x, "out", x, "x"), InvalidArgument);
  try {
    check_apart("op", shifted, "out", x, "x", true);
    FAIL() << "a shifted view is not the same view";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("op: out (bf16[2, 64] stride 64) overlaps x (bf16[2, 64] stride 64)"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(check_apart("op", at(256, DType::kBF16, 2, 64, 64), "out", x, "x"));
}

}  // namespace
}  // namespace tpdecode
