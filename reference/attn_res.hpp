// CPU reference of Block Attention Residuals and of bind_ahead's statistics. The
// math and its orders are defined in src/oproj/attn_res.cuh; this follows them
// operation by operation (row sums in the kernels' order: row_dot,
// reference/ar_norm.hpp; fma where the kernel takes an fma). Only exp may differ:
// std::exp here, CUDA's expf (within 2 ulp) there.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tpdecode::reference {

// One layer's AttnRes parameters ([hidden] BF16 bits each).
struct AttnResWeights {
  std::span<const uint16_t> key_norm;  // g
  std::span<const uint16_t> query;     // q
  std::span<const uint16_t> out_norm;  // w
  float eps = 1e-6f;
};

struct AttnResRows {
  std::vector<uint16_t> partial_out;  // [rows, hidden] p'
  std::vector<uint16_t> out;          // [rows, hidden]
  std::vector<float> mixed;           // [rows, hidden]: h, the softmax-weighted sources before the norm
};

// y: the reduced rows [rows, hidden]; partial: p [rows, hidden] (ignored when
// new_block); blocks: the nb saved blocks [nb, rows, hidden].
AttnResRows attn_res(std::span<const uint16_t> y, std::span<const uint16_t> partial, bool new_block,
                     std::span<const uint16_t> blocks, int nb, const AttnResWeights& w, int64_t hidden);

// bind_ahead: per row (mx, den) [rows, 2] and num [rows, hidden] over the nb >= 1
// saved blocks with the next layer's key norm, query and eps.
struct AttnResStats {
  std::vector<float> stats;    // [rows, 2]
  std::vector<float> mixture;  // [rows, hidden]
};
AttnResStats attn_res_ahead(std::span<const uint16_t> blocks, int nb, int rows, std::span<const uint16_t> key_norm,
                            std::span<const uint16_t> query, float eps, int64_t hidden);

// The next layer's h from the statistics and its own partial p' [rows, hidden]
// (online softmax: the saved blocks' part rescaled to the new maximum, p' added):
//   s = q·RMSNorm(p'; g);  M = max(mx, s);  a = exp(mx - M);  b = exp(s - M)
//   h_c = (num_c · a + b · p'_c) / (den · a + b)
// Equal to attn_res(...).mixed over the same sources within FP32 rounding.
std::vector<float> attn_res_merge(const AttnResStats& ahead, std::span<const uint16_t> partial,
                                  std::span<const uint16_t> key_norm, std::span<const uint16_t> query, float eps,
                                  int64_t hidden);

}  // namespace tpdecode::reference
