#include "reference/ar_norm.hpp"

#include <fmt/format.h>

#include <array>
#include <vector>
#include <cmath>

#include "comm/kernels.hpp"
#include "core/bf16.hpp"
#include "reference/all_reduce.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::reference {

float row_dot(std::span<const float> a, std::span<const float> b) {
  const auto hidden = static_cast<int64_t>(a.size());
  require(ar_norm_hidden_served(hidden) && b.size() == a.size(),
          fmt::format("reference row sum: hidden {} not served (or {} terms)", hidden, b.size()));
  const int frags_per_cta = static_cast<int>(hidden / (8 * kArNormCtas));
  const int warps = ar_norm_threads(hidden) / 32;
  float total = 0.0f;
  for (int cta = 0; cta < kArNormCtas; ++cta) {
    float cta_sum = 0.0f;
    for (int warp = 0; warp < warps; ++warp) {
      std::array<float, 32> lane{};  // step 1: each thread's fma chain over its 8 columns
      for (int l = 0; l < 32; ++l) {
        const int t = warp * 32 + l;
        if (t >= frags_per_cta) continue;
        const std::size_t first = static_cast<std::size_t>(cta * frags_per_cta + t) * 8;
        float s = 0.0f;
        for (std::size_t k = 0; k < 8; ++k) s = std::fma(a[first + k], b[first + k], s);
        lane[static_cast<std::size_t>(l)] = s;
      }
      for (int offset = 16; offset >= 1; offset /= 2) {  // step 2: butterfly
        std::array<float, 32> next{};
        for (int l = 0; l < 32; ++l)
          next[static_cast<std::size_t>(l)] = lane[static_cast<std::size_t>(l)] + lane[static_cast<std::size_t>(l ^ offset)];
        lane = next;
      }
      cta_sum = warp == 0 ? lane[0] : cta_sum + lane[0];  // step 3: warp order
    }
    total = cta == 0 ? cta_sum : total + cta_sum;  // step 4: CTA order
  }
  return total;
}

float ar_norm_square_sum(std::span<const uint16_t> row) {
  std::vector<float> v(row.size());
  for (std::size_t c = 0; c < row.size(); ++c) v[c] = bf16::to_float(row[c]);
  return row_dot(v, v);
}

float ar_norm_rstd(float total, int64_t hidden, float eps) {
  const float mean = total / static_cast<float>(hidden) + eps;
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(mean)));
}

ArNormResult add_rms_norm(std::span<const uint16_t> reduced, std::span<const uint16_t> residual,
                          std::span<const uint16_t> weight, float eps, int64_t hidden) {
  return add_rms_norm(reduced, residual, weight, eps, hidden, ar_norm_square_sum);
}

ArNormResult add_rms_norm(std::span<const uint16_t> reduced, std::span<const uint16_t> residual,
                          std::span<const uint16_t> weight, float eps, int64_t hidden,
                          const std::function<float(std::span<const uint16_t>)>& square_sum) {
  require(hidden > 0 && reduced.size() % static_cast<std::size_t>(hidden) == 0 &&
              weight.size() == static_cast<std::size_t>(hidden) && (residual.empty() || residual.size() == reduced.size()),
          "reference add_rms_norm: sizes do not match");
  ArNormResult r;
  r.residual_out.assign(reduced.begin(), reduced.end());
  if (!residual.empty())
    for (std::size_t i = 0; i < reduced.size(); ++i)
      r.residual_out[i] = bf16::from_float(bf16::to_float(reduced[i]) + bf16::to_float(residual[i]));
  r.out.resize(reduced.size());
  const auto h = static_cast<std::size_t>(hidden);
  for (std::size_t row = 0; row < reduced.size() / h; ++row) {
    const std::span<const uint16_t> v(r.residual_out.data() + row * h, h);
    const float rstd = ar_norm_rstd(square_sum(v), hidden, eps);
    for (std::size_t c = 0; c < h; ++c)
      r.out[row * h + c] = bf16::from_float((bf16::to_float(v[c]) * rstd) * bf16::to_float(weight[c]));
  }
  return r;
}

ArNormResult ar_norm(std::span<const std::vector<uint16_t>> partials, std::span<const uint16_t> residual,
                     std::span<const uint16_t> weight, float eps, int64_t hidden, bool clean_sum) {
  const std::vector<uint16_t> reduced = all_reduce(partials, clean_sum);
  return add_rms_norm(reduced, residual, weight, eps, hidden);
}

}  // namespace tpdecode::reference
