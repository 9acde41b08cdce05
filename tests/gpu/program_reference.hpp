// FP64 references of the GemmProgram tests: a GEMM on its actual input, and the
// relative RMS error of BF16 outputs (every value written) against one.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/bf16.hpp"
#include "gpu/gpu_test_util.hpp"

namespace tpdecode::test {

// Relative RMS error of `got` (bf16, every value written) against `ref`.
inline double relative_error(const std::vector<uint16_t>& got, const std::vector<double>& ref) {
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    EXPECT_NE(got[i], kPoison16) << "unwritten: element " << i;
    const double d = bf16::to_float(got[i]) - ref[i];
    if (!std::isfinite(d)) return INFINITY;
    err += d * d;
    norm += ref[i] * ref[i];
  }
  return std::sqrt(err / norm);
}

// FP64 of a plain GEMM on its actual input x [m, k].
inline std::vector<double> gemm_reference(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w, int m,
                                          int64_t k, int64_t n) {
  std::vector<double> out(static_cast<std::size_t>(m * n));
  for (int t = 0; t < m; ++t)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t c = 0; c < k; ++c)
        s += static_cast<double>(bf16::to_float(x[static_cast<std::size_t>(t * k + c)])) *
             bf16::to_float(w[static_cast<std::size_t>(j * k + c)]);
      out[static_cast<std::size_t>(t * n + j)] = s;
    }
  return out;
}

}  // namespace tpdecode::test
