#include "reference/gemm.hpp"

#include <cmath>

#include "core/bf16.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::reference {

std::vector<double> gemm_bf16(std::span<const uint16_t> x, std::span<const uint16_t> w, int64_t m, int64_t n,
                              int64_t k) {
  require(static_cast<int64_t>(x.size()) == m * k && static_cast<int64_t>(w.size()) == n * k,
          "reference gemm: operand sizes do not match m, n, k");
  std::vector<double> xd(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xd[i] = bf16::to_float(x[i]);
  std::vector<double> out(static_cast<std::size_t>(m * n));
  std::vector<double> wrow(static_cast<std::size_t>(k));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < k; ++i) wrow[i] = bf16::to_float(w[j * k + i]);
    for (int64_t r = 0; r < m; ++r) {
      const double* xr = xd.data() + r * k;
      double s = 0;
      for (int64_t i = 0; i < k; ++i) s += xr[i] * wrow[i];
      out[r * n + j] = s;
    }
  }
  return out;
}

std::vector<uint16_t> gemm_bf16_rounded(std::span<const uint16_t> x, std::span<const uint16_t> w, int64_t m, int64_t n,
                                        int64_t k) {
  const std::vector<double> y = gemm_bf16(x, w, m, n, k);
  std::vector<uint16_t> out(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) out[i] = bf16::from_float(static_cast<float>(y[i]));
  return out;
}

double relative_error(std::span<const double> a, std::span<const double> ref) {
  require(a.size() == ref.size(), "relative_error: sizes differ");
  double num = 0;
  double den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = a[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  require(den > 0, "relative_error: reference is all zeros");
  return std::sqrt(num / den);
}

}  // namespace tpdecode::reference
