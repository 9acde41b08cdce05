// The drafter step's own kernels (see kernels_launch.hpp for the contracts).
//
// Local RMSNorm summation order (the CPU reference, cpu_reference.cpp, follows it):
// one CTA of kNormThreads threads per row; thread t: s = fma(v_c, v_c, s) over
// columns c = t, t + kNormThreads, ... in order; warp butterfly s = s + s[lane ^ o]
// for o = 16, 8, 4, 2, 1; then warp sums added in warp order by thread 0;
// rstd = 1/sqrt(total / width + eps), correctly rounded; out = BF16((v · rstd) · w).
// Why explicit __fmaf_rn / __fadd_rn / __fmul_rn: no contraction the CPU cannot follow.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "core/device.cuh"
#include "core/silu_mul.cuh"
#include "drafter/weight_hash.hpp"

namespace tpdecode::drafter::kernels {

inline constexpr int kNormThreads = 256;
inline constexpr int kMaxNorms = 2;
inline constexpr int kArgmaxThreads = 1024;
inline constexpr int kElementThreads = 256;

// Every kernel here lets its successor launch at entry, before it waits for its own
// predecessor, so that DecodeGemm's weight prefetch (before its griddepcontrol.wait)
// overlaps the GEMM before this kernel, as it does between two GEMMs. Safe because a
// successor reads nothing of ours before its own wait, which returns only once this
// grid, and so its predecessor, has completed. (PDL is on only with one rank per GPU.)
__device__ __forceinline__ void pdl_enter() {
  dev::pdl_launch_dependents();
  dev::pdl_wait();
}

__device__ __forceinline__ float bf(const __nv_bfloat16& v) { return __bfloat162float(v); }

struct Rows {  // a bf16 row-major view
  __nv_bfloat16* p;
  int64_t stride;
  __device__ __nv_bfloat16& at(int64_t r, int64_t c) const { return p[r * stride + c]; }
};

__global__ void fill_kernel(__nv_bfloat16* out, int64_t rows, int64_t cols, int64_t row0, int64_t block_rows,
                            int64_t block_stride, int64_t col0, uint64_t seed, uint32_t key, float scale,
                            float bias) {
  const int64_t n = rows * cols;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += step) {
    const int64_t j = i / cols;
    const int64_t grow = (j / block_rows) * block_stride + row0 + j % block_rows;
    const float u = element_uniform(seed, key, static_cast<uint64_t>(grow), static_cast<uint64_t>(col0 + i % cols));
    out[i] = __float2bfloat16_rn(__fmaf_rn(scale, u, bias));
  }
}

// grid (fragment blocks, M): one 16-byte fragment (8 columns) per thread.
__global__ void embed_kernel(const int32_t* tokens, const uint4* table, int64_t table_rows, int64_t vocab0,
                             uint4* out, int frags) {
  pdl_enter();
  const int f = blockIdx.x * blockDim.x + threadIdx.x;
  if (f >= frags) return;
  const int64_t local = static_cast<int64_t>(tokens[blockIdx.y]) - vocab0;
  const bool mine = local >= 0 && local < table_rows;
  out[static_cast<int64_t>(blockIdx.y) * frags + f] = mine ? table[local * frags + f] : make_uint4(0, 0, 0, 0);
}

struct Norm {
  Rows x;
  const __nv_bfloat16* w;
  Rows out;
  int width;
};
struct Norms {
  Norm norm[kMaxNorms];
};

// grid (M, norms): one CTA per row of one norm.
__global__ void __launch_bounds__(kNormThreads) rms_norm_kernel(Norms norms, float eps) {
  pdl_enter();
  __shared__ float warp_sum[kNormThreads / 32];
  const auto [x, w, out, width] = norms.norm[blockIdx.y];
  const int64_t row = blockIdx.x;
  float s = 0.0f;
  for (int c = threadIdx.x; c < width; c += kNormThreads) {
    const float v = bf(x.at(row, c));
    s = __fmaf_rn(v, v, s);
  }
#pragma unroll
  for (int o = 16; o >= 1; o /= 2) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
  if (threadIdx.x % 32 == 0) warp_sum[threadIdx.x / 32] = s;
  __syncthreads();
  __shared__ float rstd;
  if (threadIdx.x == 0) {
    float total = warp_sum[0];
    for (int i = 1; i < kNormThreads / 32; ++i) total = __fadd_rn(total, warp_sum[i]);
    rstd = __frsqrt_rn(__fadd_rn(__fdiv_rn(total, static_cast<float>(width)), eps));
  }
  __syncthreads();
  for (int c = threadIdx.x; c < width; c += kNormThreads)
    out.at(row, c) = __float2bfloat16_rn(__fmul_rn(__fmul_rn(bf(x.at(row, c)), rstd), bf(w[c])));
}

// One thread per (m, local head h, d < v_head).
__global__ void attention_kernel(Rows q, Rows kv, Rows k_rope, Rows out, int rows, int heads, int head0, int nope,
                                 int rope, int v_head, int kv_lora) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<int64_t>(rows) * heads * v_head) return;
  const int d = static_cast<int>(i % v_head);
  const int h = static_cast<int>(i / v_head % heads);
  const int64_t m = i / (static_cast<int64_t>(v_head) * heads);
  const int64_t qh = static_cast<int64_t>(h) * (nope + rope);
  float s = 0.0f;
  for (int r = 0; r < rope; ++r) s = __fmaf_rn(bf(q.at(m, qh + nope + r)), bf(k_rope.at(m, r)), s);
  const int64_t latent = (static_cast<int64_t>(head0 + h) * v_head + d) % kv_lora;
  out.at(m, static_cast<int64_t>(h) * v_head + d) =
      __float2bfloat16_rn(__fmaf_rn(bf(q.at(m, qh + d)), bf(kv.at(m, latent)), __fmul_rn(s, 0.125f)));
}

__global__ void add_kernel(Rows a, Rows b, Rows out, int rows, int width) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<int64_t>(rows) * width) return;
  const int64_t m = i / width;
  const int j = static_cast<int>(i % width);
  out.at(m, j) = __float2bfloat16_rn(__fadd_rn(bf(a.at(m, j)), bf(b.at(m, j))));
}

// (value, index) order of the argmax: larger value first, then the lower index; NaN
// (never > or ==) never replaces a candidate.
__device__ __forceinline__ bool better(float v, int i, float best, int best_i) {
  return v > best || (v == best && i < best_i);
}

// One CTA per row.
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(Rows logits, int vocab, int32_t* tokens) {
  pdl_enter();
  __shared__ float warp_v[kArgmaxThreads / 32];
  __shared__ int warp_i[kArgmaxThreads / 32];
  const int64_t row = blockIdx.x;
  float best = -INFINITY;
  int best_i = vocab;
  for (int c = threadIdx.x; c < vocab; c += kArgmaxThreads) {
    const float v = bf(logits.at(row, c));
    if (better(v, c, best, best_i)) best = v, best_i = c;
  }
#pragma unroll
  for (int o = 16; o >= 1; o /= 2) {
    const float v = __shfl_xor_sync(0xffffffffu, best, o);
    const int i = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (better(v, i, best, best_i)) best = v, best_i = i;
  }
  if (threadIdx.x % 32 == 0) warp_v[threadIdx.x / 32] = best, warp_i[threadIdx.x / 32] = best_i;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w)
      if (better(warp_v[w], warp_i[w], best, best_i)) best = warp_v[w], best_i = warp_i[w];
    // Why: a row of NaN / -inf only still yields a valid token (0).
    tokens[row] = best_i < vocab ? best_i : 0;
  }
}

}  // namespace tpdecode::drafter::kernels
