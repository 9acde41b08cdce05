// The o-projection's CPU reference math: the row sum in the kernels' order, Block
// Attention Residuals (cases with known answers, against an independent FP64
// softmax, both block flags) and bind_ahead's statistics merged with the next
// layer's partial against the direct computation.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/bf16.hpp"
#include "reference/all_reduce.hpp"
#include "reference/ar_norm.hpp"
#include "reference/attn_res.hpp"
#include "reference/gemm.hpp"

namespace tpdecode::reference {
namespace {

constexpr int64_t kHidden = 1024;
constexpr float kEps = 1e-6f;

std::vector<uint16_t> random_bf16(std::size_t n, std::mt19937_64& rng, float scale = 1.0f, float bias = 0.0f) {
  std::normal_distribution<float> d(bias, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = bf16::from_float(d(rng));
  return v;
}

struct Layer {
  std::vector<uint16_t> g, q, w;
  AttnResWeights weights() const { return {g, q, w, kEps}; }
};

Layer random_layer(std::mt19937_64& rng) {
  // g near 1, q scaled so that logits differ by O(1): the softmax is not one-hot.
  return {random_bf16(kHidden, rng, 0.1f, 1.0f), random_bf16(kHidden, rng, 1.0f / 32), random_bf16(kHidden, rng, 0.1f, 1.0f)};
}

// An independent FP64 evaluation of the same definition (no kernel order).
std::vector<double> attn_res_fp64(const std::vector<uint16_t>& fresh, const std::vector<uint16_t>& blocks, int nb,
                                  int rows, const Layer& l) {
  const auto h = static_cast<std::size_t>(kHidden);
  std::vector<double> out(static_cast<std::size_t>(rows) * h);
  for (std::size_t row = 0; row < static_cast<std::size_t>(rows); ++row) {
    std::vector<const uint16_t*> src;
    for (int i = 0; i < nb; ++i) src.push_back(blocks.data() + (static_cast<std::size_t>(i) * rows + row) * h);
    src.push_back(fresh.data() + row * h);
    std::vector<double> s(src.size());
    for (std::size_t i = 0; i < src.size(); ++i) {
      double ss = 0, d = 0;
      for (std::size_t c = 0; c < h; ++c) {
        const double v = bf16::to_float(src[i][c]);
        ss += v * v;
        d += v * bf16::to_float(l.g[c]) * bf16::to_float(l.q[c]);
      }
      s[i] = d / std::sqrt(ss / kHidden + kEps);
    }
    const double mx = *std::max_element(s.begin(), s.end());
    double z = 0;
    for (double& x : s) z += (x = std::exp(x - mx));
    for (std::size_t c = 0; c < h; ++c) {
      double acc = 0;
      for (std::size_t i = 0; i < src.size(); ++i) acc += s[i] / z * bf16::to_float(src[i][c]);
      out[row * h + c] = acc;
    }
  }
  return out;
}

double max_rel(const std::vector<float>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(a[i] - ref[i]));
    den = std::max(den, std::abs(ref[i]));
  }
  return num / den;
}

TEST(OprojReference, RowDotIsTheArNormSquareSumAndASum) {
  std::mt19937_64 rng(7);
  for (int64_t hidden : {64, 1024, 4096, 7168, 16384}) {
    const std::vector<uint16_t> row = random_bf16(static_cast<std::size_t>(hidden), rng);
    std::vector<float> v(row.size()), u(row.size());
    double exact = 0;
    for (std::size_t c = 0; c < row.size(); ++c) {
      v[c] = bf16::to_float(row[c]);
      u[c] = static_cast<float>(rng() % 7) - 3.0f;
      exact += static_cast<double>(v[c]) * u[c];
    }
    EXPECT_EQ(bf16::bits_of_float(row_dot(v, v)), bf16::bits_of_float(ar_norm_square_sum(row))) << hidden;
    EXPECT_NEAR(row_dot(v, u), exact, 1e-4 * std::sqrt(static_cast<double>(hidden))) << hidden;
  }
}

TEST(OprojReference, PartialRoundsTheFp64ProductOnce) {
  std::mt19937_64 rng(3);
  const std::vector<uint16_t> x = random_bf16(2 * 256, rng), w = random_bf16(64 * 256, rng, 0.05f);
  const std::vector<double> y = gemm_bf16(x, w, 2, 64, 256);
  const std::vector<uint16_t> p = gemm_bf16_rounded(x, w, 2, 64, 256);
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_EQ(p[i], bf16::from_float(static_cast<float>(y[i])));
}

// No saved block and a new block: one source with weight exactly 1, so the output
// is ArNorm's RMSNorm of y with w, bit for bit (the same row sum, rstd and products).
TEST(OprojReference, AttnResWithOneSourceIsTheRowNorm) {
  std::mt19937_64 rng(11);
  const int rows = 3;
  const Layer l = random_layer(rng);
  const std::vector<uint16_t> y = random_bf16(rows * kHidden, rng, 2.0f);
  const AttnResRows r = attn_res(y, {}, true, {}, 0, l.weights(), kHidden);
  const ArNormResult n = add_rms_norm(y, {}, l.w, kEps, kHidden);
  EXPECT_EQ(r.partial_out, y);
  EXPECT_EQ(r.out, n.out);
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_EQ(r.mixed[i], bf16::to_float(y[i]));
}

// A saved block equal to p': two equal logits, weights 1/2 each: h = p' exactly.
TEST(OprojReference, AttnResOfTwoEqualSourcesIsThatSource) {
  std::mt19937_64 rng(12);
  const int rows = 2;
  const Layer l = random_layer(rng);
  const std::vector<uint16_t> y = random_bf16(rows * kHidden, rng), p = random_bf16(rows * kHidden, rng);
  AttnResRows first = attn_res(y, p, false, {}, 0, l.weights(), kHidden);
  const AttnResRows r = attn_res(y, p, false, first.partial_out, 1, l.weights(), kHidden);
  for (std::size_t i = 0; i < y.size(); ++i) {
    ASSERT_EQ(r.partial_out[i], bf16::from_float(bf16::to_float(y[i]) + bf16::to_float(p[i])));
    ASSERT_EQ(r.mixed[i], bf16::to_float(r.partial_out[i]));
  }
  EXPECT_EQ(r.out, first.out);
}

TEST(OprojReference, AttnResMatchesAnFp64SoftmaxForEveryBlockCountAndFlag) {
  std::mt19937_64 rng(13);
  const int rows = 3;
  for (int nb : {0, 1, 5, 12}) {
    for (bool new_block : {false, true}) {
      SCOPED_TRACE(testing::Message() << "nb " << nb << (new_block ? " new block" : " same block"));
      const Layer l = random_layer(rng);
      const std::vector<uint16_t> y = random_bf16(rows * kHidden, rng), p = random_bf16(rows * kHidden, rng);
      const std::vector<uint16_t> blocks = random_bf16(static_cast<std::size_t>(nb) * rows * kHidden, rng, 1.5f);
      const AttnResRows r = attn_res(y, p, new_block, blocks, nb, l.weights(), kHidden);
      EXPECT_LT(max_rel(r.mixed, attn_res_fp64(r.partial_out, blocks, nb, rows, l)), 1e-5);
      // The output is the row norm of h: its RMS over w is 1.
      for (int row = 0; row < rows; ++row) {
        double ss = 0;
        for (int64_t c = 0; c < kHidden; ++c) {
          const double v = bf16::to_float(r.out[row * kHidden + c]) / bf16::to_float(l.w[c]);
          ss += v * v;
        }
        EXPECT_NEAR(std::sqrt(ss / kHidden), 1.0, 1e-2);
      }
    }
  }
}

TEST(OprojReference, BindAheadMergedWithTheNextPartialIsTheDirectComputation) {
  std::mt19937_64 rng(14);
  const int rows = 4;
  for (int nb : {1, 5, 12}) {
    SCOPED_TRACE(testing::Message() << "nb " << nb);
    const Layer next = random_layer(rng);
    const std::vector<uint16_t> blocks = random_bf16(static_cast<std::size_t>(nb) * rows * kHidden, rng);
    const std::vector<uint16_t> y = random_bf16(rows * kHidden, rng);  // the next layer's p' (a new block)
    const AttnResStats s = attn_res_ahead(blocks, nb, rows, next.g, next.q, kEps, kHidden);
    const std::vector<float> merged = attn_res_merge(s, y, next.g, next.q, kEps, kHidden);
    const AttnResRows direct = attn_res(y, {}, true, blocks, nb, next.weights(), kHidden);
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < merged.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(merged[i] - direct.mixed[i])));
      scale = std::max(scale, static_cast<double>(std::abs(direct.mixed[i])));
    }
    EXPECT_LT(worst / scale, 1e-5);
  }
}

}  // namespace
}  // namespace tpdecode::reference
