#include "reference/program_norm.hpp"

#include <cmath>

#include "core/bf16.hpp"
#include "core/check.hpp"
#include "program/program_protocol.hpp"

namespace tpdecode::reference {

float program_norm_square_sum(std::span<const uint16_t> row, int ctas) {
  const auto k = static_cast<int64_t>(row.size());
  std::vector<float> share(static_cast<std::size_t>((ctas + 3) / 4 * 4), 0.0f);
  for (int c = 0; c < ctas; ++c) {
    const program::protocol::Range r = program::protocol::norm_share(k, c, ctas);
    float sum = 0.0f;
    for (int64_t p = r.begin; p < r.end; ++p) {
      float piece = 0.0f;
      for (int64_t j = 8 * p; j < 8 * p + 8; ++j) {
        const float v = bf16::to_float(row[static_cast<std::size_t>(j)]);
        piece = std::fma(v, v, piece);
      }
      sum += piece;
    }
    share[static_cast<std::size_t>(c)] = sum;
  }
  float total = 0.0f;
  for (std::size_t g = 0; g < share.size(); g += 4)
    total += (((0.0f + share[g]) + share[g + 1]) + share[g + 2]) + share[g + 3];
  return total;
}

ArNormResult program_norm(std::span<const uint16_t> x, std::span<const uint16_t> residual,
                          std::span<const uint16_t> weight, float eps, int64_t k, int ctas) {
  check(k > 0 && k % 8 == 0 && ctas > 0, "program_norm: k {} (a multiple of 8), {} CTAs", k, ctas);
  return add_rms_norm(x, residual, weight, eps, k,
                      [ctas](std::span<const uint16_t> row) { return program_norm_square_sum(row, ctas); });
}

}  // namespace tpdecode::reference
