// CPU reference of GemmProgram's Norm op (src/program/program_norm.cuh), bit for bit
// where rstd agrees: h = x, or bf16(x + residual); the row's sum of squares in the
// program's order (each CTA's share of the columns, protocol::norm_share: per piece
// of 8 columns an fma chain from 0, the pieces added in order; the CTAs' sums added
// in fours, in CTA order, and the fours in order); rstd as ar_norm_rstd; out =
// bf16((h * rstd) * weight).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "reference/ar_norm.hpp"

namespace tpdecode::reference {

// The row's sum of squares in the program's order on `ctas` CTAs.
float program_norm_square_sum(std::span<const uint16_t> row, int ctas);

// x: [rows, k]; residual: [rows, k] or empty; weight: [k].
ArNormResult program_norm(std::span<const uint16_t> x, std::span<const uint16_t> residual,
                          std::span<const uint16_t> weight, float eps, int64_t k, int ctas);

}  // namespace tpdecode::reference
