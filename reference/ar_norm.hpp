// CPU reference of ArNorm, bit for bit with the kernel where rstd agrees: the
// all-reduce (reference/all_reduce.hpp), the residual add rounded once, and the
// RMSNorm with the row's sum of squares added in the kernel's exact order
// (include/tpdecode/ar_norm.hpp: thread, warp butterfly, CTA, cluster).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace tpdecode::reference {

struct ArNormResult {
  std::vector<uint16_t> residual_out;  // [rows, hidden] bf16 bits
  std::vector<uint16_t> out;           // [rows, hidden] bf16 bits
};

// partials[r]: rank r's [rows, hidden]; residual: [rows, hidden] or empty (none:
// the new residual is the reduced row); weight: [hidden]; clean_sum: all_reduce's.
ArNormResult ar_norm(std::span<const std::vector<uint16_t>> partials, std::span<const uint16_t> residual,
                     std::span<const uint16_t> weight, float eps, int64_t hidden, bool clean_sum = false);

// The row's FP32 sum of squares in the kernel's order (hidden supported by ArNorm).
float ar_norm_square_sum(std::span<const uint16_t> row);

// The row sum of the FP32 terms fma(a[c], b[c], ·) in the same order (what every
// row sum of the row kernels takes: the thread's fma chain over its 8 columns,
// the warp butterfly, warps in order, the 8 CTAs in order); a.size() is the
// hidden size. ar_norm_square_sum(row) is row_dot(v, v) of the row's values.
float row_dot(std::span<const float> a, std::span<const float> b);

// 1 / sqrt(total / hidden + eps): the division and addition rounded to FP32, the
// reciprocal square root correctly rounded (computed in double, then rounded).
float ar_norm_rstd(float total, int64_t hidden, float eps);

// The separate steps, for rows that are already reduced (the stock path's norm):
// residual_out = reduced (+ residual), out = RMSNorm(residual_out) · weight.
ArNormResult add_rms_norm(std::span<const uint16_t> reduced, std::span<const uint16_t> residual,
                          std::span<const uint16_t> weight, float eps, int64_t hidden);
// The same with the row's sum of squares in another order (a norm of another kernel).
ArNormResult add_rms_norm(std::span<const uint16_t> reduced, std::span<const uint16_t> residual,
                          std::span<const uint16_t> weight, float eps, int64_t hidden,
                          const std::function<float(std::span<const uint16_t>)>& square_sum);

}  // namespace tpdecode::reference
