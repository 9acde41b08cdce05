// What the GEMM commands (bench gemm, bench chain, tune) share: the synthetic
// drafter's per-rank linears at a TP, mid-size weights, --shape parsing,
// the GPU they run on, and a decision's description with its launch shape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gemm/gemm_tactic.hpp"

namespace tpdecode::cli {

struct GemmShape {
  std::string set, name;
  int64_t n, k;
  double bytes() const { return 2.0 * static_cast<double>(n) * static_cast<double>(k); }
};

// The per-rank linears of docs/drafter.md at TP `tp` (1, 2, 4, 8): fused_qkv_a
// (replicated), q_b, o_proj, gate_up, down, lm_head, context projection.
std::vector<GemmShape> drafter_shapes(int tp);
// The first five: one draft layer's GEMMs.
std::vector<GemmShape> layer_shapes(int tp);
// Mid-size weights (1152 x 1536 to 40960 x 7168): cuBLAS streams several of them at
// 73-85 % of the read ceiling, and a static rule is easily wrong on them.
std::vector<GemmShape> mid_shapes();
// "NxK": InvalidArgument for anything else, or sides outside [1, kMaxShapeSide], or
// more than kMaxShapeElements (32 GiB of BF16: the commands allocate copies of it).
inline constexpr int64_t kMaxShapeSide = (int64_t{1} << 31) - 1;
inline constexpr int64_t kMaxShapeElements = int64_t{1} << 34;
GemmShape parse_shape(const std::string& text);

struct Gpu {
  std::string name;
  int sms = 0;
  std::size_t l2 = 0;
};
// The current GPU; Unavailable naming `command` where there is none.
Gpu require_gpu(const char* command);

// e.g. "warp 33 blocks x split 8, 1 token tile", "cublaslt algo 21 tile 18 split-K 1".
std::string tactic_of(const GemmDecision& d, int64_t n, int64_t k, int m);

}  // namespace tpdecode::cli
