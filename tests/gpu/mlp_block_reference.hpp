// The MLP block's CPU reference steps (MlpBlockProgram, TeamMlpBlock tests): FP64
// math, rounded to BF16 where the unfolded block stores.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/bf16.hpp"

namespace tpdecode::test {

inline std::vector<uint16_t> rounded(const std::vector<double>& v) {
  std::vector<uint16_t> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = bf16::from_float(static_cast<float>(v[i]));
  return r;
}
inline std::vector<double> values(const std::vector<uint16_t>& v) {
  std::vector<double> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = bf16::to_float(v[i]);
  return r;
}

// residual <- bf16(residual + x); returns bf16(rmsnorm(residual) * gamma), [m, H]
// (H: gamma's size).
inline std::vector<uint16_t> add_norm(std::vector<uint16_t>& residual, const std::vector<uint16_t>& x,
                                      const std::vector<uint16_t>& gamma, int m, float eps) {
  const auto h = static_cast<int64_t>(gamma.size());
  std::vector<uint16_t> out(residual.size());
  for (int t = 0; t < m; ++t) {
    double sq = 0;
    for (int64_t c = 0; c < h; ++c) {
      const std::size_t i = static_cast<std::size_t>(t * h + c);
      residual[i] = bf16::from_float(bf16::to_float(residual[i]) + bf16::to_float(x[i]));
      sq += std::pow(bf16::to_float(residual[i]), 2);
    }
    const double rstd = 1 / std::sqrt(sq / static_cast<double>(h) + eps);
    for (int64_t c = 0; c < h; ++c) {
      const std::size_t i = static_cast<std::size_t>(t * h + c);
      out[i] = bf16::from_float(static_cast<float>(bf16::to_float(residual[i]) * rstd *
                                                   bf16::to_float(gamma[static_cast<std::size_t>(c)])));
    }
  }
  return out;
}

// bf16(silu(gate) * up) of a rounded gate_up [m, 2 inter] (gate columns, then up).
inline std::vector<uint16_t> silu_mul(const std::vector<uint16_t>& gu, int m, int64_t inter) {
  std::vector<uint16_t> act(static_cast<std::size_t>(m * inter));
  for (int t = 0; t < m; ++t)
    for (int64_t j = 0; j < inter; ++j) {
      const double g = bf16::to_float(gu[static_cast<std::size_t>(t * 2 * inter + j)]),
                   up = bf16::to_float(gu[static_cast<std::size_t>(t * 2 * inter + inter + j)]);
      act[static_cast<std::size_t>(t * inter + j)] = bf16::from_float(static_cast<float>(g / (1 + std::exp(-g)) * up));
    }
  return act;
}

}  // namespace tpdecode::test
