// x / s rounded once (to nearest, ties to even), from r = 1 / s rounded once, in
// three operations instead of a division: q = x · r is within an ulp of x / s, the
// remainder x - q · s is exact in an FMA, and q + remainder · r then rounds to the
// correctly rounded quotient (Markstein's correction). The sign is x's (s > 0), which
// the correction alone loses for x = -0.
//
// Where it holds: s finite and positive, r = 1 / s rounded once and normal, the
// remainder not subnormal. Used by the per-group FP8 epilogue (row_quant.cuh),
// where s = amax / 448 >= 1e-10 / 448 and |x| <= amax; tests/cpu/
// exact_quotient_test.cpp checks it against the division for every BF16 x and every
// scale a BF16 amax gives (the quotient's e4m3 code everywhere, its bits where
// |x / s| >= 2^-20).
#pragma once

#include <cmath>

#include "core/bf16.hpp"

namespace tpdecode {

TPD_HD float quotient_by_reciprocal(float x, float s, float r) {
#if defined(__CUDA_ARCH__)
  const float q = __fmul_rn(x, r);
  const float e = __fmaf_rn(-q, s, x);
  return copysignf(__fmaf_rn(e, r, q), x);
#else
  const float q = x * r;
  const float e = std::fma(-q, s, x);
  return std::copysign(std::fma(e, r, q), x);
#endif
}

}  // namespace tpdecode
