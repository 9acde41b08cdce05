// The CPU references of ArNorm, Gather and GemmProgram's Norm op: the kernels'
// summation orders, the exactness contract, cleaning of sentinel words.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "comm/kernels.hpp"
#include "core/bf16.hpp"
#include "reference/all_reduce.hpp"
#include "reference/ar_norm.hpp"
#include "reference/gather.hpp"
#include "reference/program_norm.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

std::vector<uint16_t> random_row(std::size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = bf16::from_float(d(rng));
  return v;
}

int frags_per_cta(int64_t hidden) { return static_cast<int>(hidden / (8 * kArNormCtas)); }

TEST(ArNormReference, LaunchLayoutPerHiddenSize) {
  EXPECT_EQ(frags_per_cta(7168), 112);
  EXPECT_EQ(ar_norm_threads(7168), 128);
  EXPECT_EQ(ar_norm_threads(4096), 64);
  EXPECT_EQ(ar_norm_threads(5120), 96);  // 80 fragments: the last warp half idle
  EXPECT_EQ(ar_norm_threads(6144), 96);
  EXPECT_EQ(ar_norm_threads(16384), kArNormMaxThreads);
  EXPECT_EQ(ar_norm_threads(64), 32);
}

// Lane 0's butterfly result is the pairwise tree that halves the 32 lanes five
// times: an independent statement of step 2 of the documented order.
float tree_order_square_sum(const std::vector<uint16_t>& row) {
  const auto hidden = static_cast<int64_t>(row.size());
  const int per_cta = frags_per_cta(hidden);
  const int warps = ar_norm_threads(hidden) / 32;
  float total = 0.0f;
  for (int c = 0; c < kArNormCtas; ++c) {
    float cta = 0.0f;
    for (int w = 0; w < warps; ++w) {
      std::vector<float> lanes(32, 0.0f);
      for (int l = 0; l < 32 && w * 32 + l < per_cta; ++l)
        for (int k = 0; k < 8; ++k) {
          const float v = bf16::to_float(row[static_cast<std::size_t>((c * per_cta + w * 32 + l) * 8 + k)]);
          lanes[static_cast<std::size_t>(l)] = std::fma(v, v, lanes[static_cast<std::size_t>(l)]);
        }
      for (std::size_t n = 16; n >= 1; n /= 2)
        for (std::size_t l = 0; l < n; ++l) lanes[l] = lanes[l] + lanes[l + n];
      cta = w == 0 ? lanes[0] : cta + lanes[0];
    }
    total = c == 0 ? cta : total + cta;
  }
  return total;
}

TEST(ArNormReference, SquareSumFollowsTheKernelOrder) {
  std::mt19937_64 rng(7);
  for (int64_t hidden : {2048, 3584, 4096, 5120, 6144, 7168, 8192, 12288, 16384}) {
    // Wide dynamic range so that a different order would change the bits.
    std::vector<uint16_t> row = random_row(static_cast<std::size_t>(hidden), rng);
    for (std::size_t i = 0; i < row.size(); i += 97) row[i] = bf16::from_float(300.0f + static_cast<float>(i % 13));
    const float got = reference::ar_norm_square_sum(row);
    EXPECT_EQ(got, tree_order_square_sum(row)) << "hidden " << hidden;
    double exact = 0;
    for (uint16_t b : row) exact += static_cast<double>(bf16::to_float(b)) * bf16::to_float(b);
    EXPECT_NEAR(got, exact, exact * 1e-5) << "hidden " << hidden;
  }
  EXPECT_THROW(reference::ar_norm_square_sum(std::vector<uint16_t>(1000)), InvalidArgument);
}

TEST(ArNormReference, RstdIsCorrectlyRounded) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> d(1e-3f, 1e4f);
  for (int i = 0; i < 10000; ++i) {
    const float total = d(rng) * 7168.0f;
    const float r = reference::ar_norm_rstd(total, 7168, 1e-6f);
    const double mean = static_cast<double>(total / 7168.0f + 1e-6f);
    const double exact = 1.0 / std::sqrt(mean);
    // No neighbouring float is closer to the exact value.
    EXPECT_LE(std::abs(r - exact), std::abs(std::nextafter(r, 0.0f) - exact));
    EXPECT_LE(std::abs(r - exact), std::abs(std::nextafter(r, 1e30f) - exact));
  }
}

TEST(ArNormReference, ResidualAddRoundsOnceAndNormIsWithinOneUlpOfDouble) {
  std::mt19937_64 rng(13);
  constexpr int kRanks = 4, kRows = 3;
  constexpr int64_t kHidden = 7168;
  const auto n = static_cast<std::size_t>(kRows * kHidden);
  std::vector<std::vector<uint16_t>> parts;
  for (int r = 0; r < kRanks; ++r) parts.push_back(random_row(n, rng));
  const std::vector<uint16_t> residual = random_row(n, rng, 2.0f);
  const std::vector<uint16_t> weight = random_row(kHidden, rng, 0.5f);
  const float eps = 1e-6f;
  const reference::ArNormResult res = reference::ar_norm(parts, residual, weight, eps, kHidden);
  const std::vector<uint16_t> reduced = reference::all_reduce(parts);
  long exact = 0;
  for (int row = 0; row < kRows; ++row) {
    double ss = 0;
    for (int64_t c = 0; c < kHidden; ++c) {
      const auto i = static_cast<std::size_t>(row * kHidden + c);
      ASSERT_EQ(res.residual_out[i], bf16::from_float(bf16::to_float(reduced[i]) + bf16::to_float(residual[i])));
      ss += static_cast<double>(bf16::to_float(res.residual_out[i])) * bf16::to_float(res.residual_out[i]);
    }
    const double rstd = 1.0 / std::sqrt(ss / kHidden + eps);
    for (int64_t c = 0; c < kHidden; ++c) {
      const auto i = static_cast<std::size_t>(row * kHidden + c);
      const uint16_t want =
          bf16::from_float(static_cast<float>(bf16::to_float(res.residual_out[i]) * rstd * bf16::to_float(weight[c])));
      ASSERT_LE(bf16::ulp_distance(res.out[i], want), 1) << "row " << row << " column " << c;
      exact += res.out[i] == want;
    }
  }
  EXPECT_GT(exact, kRows * kHidden * 9 / 10);
}

TEST(ArNormReference, NoResidualKeepsTheReducedRow) {
  std::mt19937_64 rng(17);
  std::vector<std::vector<uint16_t>> parts = {random_row(4096, rng), random_row(4096, rng)};
  parts[1][10] = 0x0000;  // a planted sentinel word: sent as (+0, +0)
  parts[1][11] = 0x8000;
  const std::vector<uint16_t> weight = random_row(4096, rng);
  const reference::ArNormResult res = reference::ar_norm(parts, {}, weight, 1e-5f, 4096);
  EXPECT_EQ(res.residual_out, reference::all_reduce(parts));
  const reference::ArNormResult split = reference::add_rms_norm(res.residual_out, {}, weight, 1e-5f, 4096);
  EXPECT_EQ(split.out, res.out);
}

TEST(GatherReference, PlacesShardsByRankAndCleansOnlySentinelWords) {
  constexpr int64_t kRows = 2, kWords = 4;
  std::vector<std::vector<uint32_t>> shards(3, std::vector<uint32_t>(kRows * kWords));
  uint32_t x = 99;
  for (auto& s : shards)
    for (auto& w : s) w = (x = x * 1664525u + 1013904223u) | 1u;
  shards[1][5] = 0x80000000u;  // the sentinel pair (+0, -0)
  shards[2][0] = 0x00008000u;  // (-0, +0): not the sentinel, kept
  const std::vector<uint32_t> out = reference::gather(shards, kRows, kWords);
  ASSERT_EQ(out.size(), static_cast<std::size_t>(kRows * 3 * kWords));
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t row = 0; row < kRows; ++row)
      for (int64_t w = 0; w < kWords; ++w) {
        const uint32_t sent = shards[static_cast<std::size_t>(r)][static_cast<std::size_t>(row * kWords + w)];
        EXPECT_EQ(out[static_cast<std::size_t>((row * 3 + r) * kWords + w)], sent == 0x80000000u ? 0u : sent);
      }
  EXPECT_EQ(out[static_cast<std::size_t>((1 * 3 + 1) * kWords + 1)], 0u);
}

// ---- GemmProgram's Norm op (reference/program_norm.hpp) ----

// The order restated: CTA c's share is the pieces [P c / ctas, P (c + 1) / ctas) of
// P = k / 8; each piece an fma chain from 0; the shares' sums in fours.
float restated(const std::vector<uint16_t>& row, int ctas) {
  const int64_t pieces = static_cast<int64_t>(row.size()) / 8;
  std::vector<float> sums;
  for (int c = 0; c < ctas; ++c) {
    float s = 0.0f;
    for (int64_t p = pieces * c / ctas; p < pieces * (c + 1) / ctas; ++p) {
      float piece = 0.0f;
      for (int j = 0; j < 8; ++j) {
        const float v = bf16::to_float(row[static_cast<std::size_t>(8 * p + j)]);
        piece = std::fma(v, v, piece);
      }
      s = s + piece;
    }
    sums.push_back(s);
  }
  while (sums.size() % 4 != 0) sums.push_back(0.0f);
  float total = 0.0f;
  for (std::size_t g = 0; g < sums.size(); g += 4) total = total + (((sums[g] + sums[g + 1]) + sums[g + 2]) + sums[g + 3]);
  return total;
}

TEST(ProgramNormReference, SquareSumInTheProgramsOrder) {
  std::mt19937_64 rng(7);
  for (int64_t k : {8, 64, 1536, 7168, 8200})
    for (int ctas : {1, 3, 132}) {
      const std::vector<uint16_t> row = random_row(static_cast<std::size_t>(k), rng);
      const float got = reference::program_norm_square_sum(row, ctas);
      EXPECT_EQ(got, restated(row, ctas)) << "k " << k << ", " << ctas << " CTAs";
      double exact = 0;
      for (uint16_t v : row) exact += static_cast<double>(bf16::to_float(v)) * bf16::to_float(v);
      EXPECT_NEAR(got, exact, 1e-5 * exact) << "k " << k << ", " << ctas << " CTAs";
    }
}

TEST(ProgramNormReference, ResidualRoundedOnceAndNormAgainstFp64) {
  std::mt19937_64 rng(11);
  const int64_t k = 7168;
  const int rows = 3;
  const std::vector<uint16_t> x = random_row(static_cast<std::size_t>(rows * k), rng, 2.0f);
  const std::vector<uint16_t> residual = random_row(static_cast<std::size_t>(rows * k), rng, 3.0f);
  const std::vector<uint16_t> weight = random_row(static_cast<std::size_t>(k), rng);
  const reference::ArNormResult r = reference::program_norm(x, residual, weight, 1e-6f, k, 132);
  for (std::size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(r.residual_out[i], bf16::from_float(bf16::to_float(x[i]) + bf16::to_float(residual[i]))) << i;
  for (int row = 0; row < rows; ++row) {
    double ss = 0;
    for (int64_t c = 0; c < k; ++c) {
      const double h = bf16::to_float(r.residual_out[static_cast<std::size_t>(row * k + c)]);
      ss += h * h;
    }
    const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(k) + 1e-6);
    for (int64_t c = 0; c < k; ++c) {
      const std::size_t i = static_cast<std::size_t>(row * k + c);
      const double want = bf16::to_float(r.residual_out[i]) * rstd * bf16::to_float(weight[static_cast<std::size_t>(c)]);
      EXPECT_NEAR(bf16::to_float(r.out[i]), want, std::abs(want) * 8e-3 + 1e-6) << "row " << row << ", column " << c;
    }
  }
  // Without a residual, h is x itself.
  const reference::ArNormResult plain = reference::program_norm(x, {}, weight, 1e-6f, k, 132);
  EXPECT_TRUE(plain.residual_out == x);
}

}  // namespace
}  // namespace tpdecode
