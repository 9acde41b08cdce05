// The FP64 reference GEMM the device tests compare against.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tpdecode::reference {

// out[m * n + j] = sum_k x[m * k + i] * w[j * k + i] in FP64, from BF16 bits.
// x: [m, k], w: [n, k], both row-major contiguous BF16.
std::vector<double> gemm_bf16(std::span<const uint16_t> x, std::span<const uint16_t> w, int64_t m, int64_t n,
                              int64_t k);

// The same product rounded once to BF16 (a rank's partial of a row-parallel linear).
std::vector<uint16_t> gemm_bf16_rounded(std::span<const uint16_t> x, std::span<const uint16_t> w, int64_t m, int64_t n,
                                        int64_t k);

// ||a - ref|| / ||ref|| (Frobenius); ref must not be all zeros.
double relative_error(std::span<const double> a, std::span<const double> ref);

}  // namespace tpdecode::reference
