// CPU reference of ar_norm's FP8 epilogues: what the kernels write instead of the
// BF16 normalised row, bit for bit. The quantiser reads the BF16-rounded
// normalised values (ar_norm's BF16 output, reference/ar_norm.hpp), so an FP8 call
// gives exactly ar_norm's BF16 output quantised by the functions below.
//
// e4m3 is OCP E4M3FN (torch.float8_e4m3fn): sign, 4 exponent bits (bias 7), 3
// mantissa bits, no infinities, S.1111.111 the only NaN; largest finite 448,
// smallest normal 2^-6, subnormals m · 2^-9 (m = 1..7).
//
// Static (vLLM's rms_norm static-FP8 semantic, fused_add_rms_norm_static_fp8_quant):
//   inv = 1 / scale, rounded to FP32 once; q = e4m3(v · inv), the product rounded
//   to FP32 once.
// Dynamic per-token group (vLLM's per_token_group_quant_fp8, group 128, row-major
// scales [rows, hidden / 128]):
//   amax = max |v| over the group's 128 values (a NaN in the group makes it NaN);
//   amax = max(amax, 1e-10); scale = amax / 448 rounded to FP32 once;
//   UE8M0: scale = the smallest power of two >= scale (exactly; infinities and NaN
//   stay as they are);
//   q = e4m3(v / scale), the quotient rounded to FP32 once.
// e4m3(x): round to nearest, ties to even; |x| > 448 (infinities included)
// saturates to ±448; NaN gives S.1111.111 with x's sign; a value that rounds to
// zero keeps its sign (-0 is 0x80).
//
// Where this differs from vLLM (on inputs with a NaN, and in two corner cases):
//  - vLLM clamps with fminf/fmaxf before converting, which turns NaN into a finite
//    value (+448 static, -448 dynamic) and drops a NaN from the group's amax
//    (fmaxf); here NaN stays NaN in the value and in the group's scale, so a
//    poisoned row (a failed call, docs/protocol.md) stays visibly poisoned.
//  - UE8M0: vLLM's CUDA kernel computes exp2f(ceilf(log2f(max(scale, 1e-10)))).
//    log2f rounds to FP32, so for a scale a few ulps above a power of two 2^k
//    (|k| >= 4) it can return k itself: the scale is then 2^k and the group's
//    largest values saturate at 448; here it is 2^(k+1), the next power of two.
//    Its extra 1e-10 floor on the scale (2^-33 for an all-zero group; its Triton
//    kernel and this reference: 2^-42) changes only groups whose amax is below
//    4.5e-8.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tpdecode::reference {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr int64_t kQuantGroup = 128;         // columns per dynamic scale
inline constexpr float kGroupAmaxFloor = 1e-10f;    // vLLM's eps of per_token_group_quant_fp8

// e4m3 bits of x (see above) and the exact value of e4m3 bits.
uint8_t e4m3_from_float(float x);
float float_from_e4m3(uint8_t bits);

// The static epilogue of BF16 values v (bits): e4m3(v · (1 / scale)).
std::vector<uint8_t> quantise_static(std::span<const uint16_t> v, float scale);

// A group's scale from its amax (before the 1e-10 floor), FP32 or UE8M0.
float group_scale(float amax, bool ue8m0);

struct GroupQuant {
  std::vector<uint8_t> q;     // [rows, hidden] e4m3 bits
  std::vector<float> scales;  // [rows, hidden / 128]
};
// The dynamic epilogue of BF16 rows v ([rows, hidden] bits, hidden a multiple of 128).
GroupQuant quantise_groups(std::span<const uint16_t> v, int64_t hidden, bool ue8m0);

}  // namespace tpdecode::reference
