// Block Attention Residuals (Kimi "Attention Residuals", 2026) as a row epilogue
// (row_collective.cuh's interface): the o-projection's consumers and the unfused
// path's AttnRes kernel run this one function, so they give the same bits. The CPU
// reference (reference/attn_res.cpp) follows the same operations in the same order.
//
// Row m (all FP32 unless rounded; fma/mul/add/div rounded once each; "rowsum" is
// ArNorm's order, row_norm.cuh: a per-thread fma chain over the thread's 8 columns
// in column order, the warp butterfly, warps in order, the 8 CTAs in order):
//   y   the reduced attention output (BF16), p the block's partial (BF16)
//   p'  = y (new block) or BF16(y + p)                          written back
//   sources v_0 .. v_{nb-1} (the saved blocks), v_nb = p'        (BF16)
//   u_c = g_c · q_c
//   ss_i = rowsum fma(v_ic, v_ic),  d_i = rowsum fma(v_ic, u_c)
//   s_i = d_i · rstd(ss_i),  rstd(ss) = 1 / sqrt(ss / H + eps) (correctly rounded)
//   mx = max_i s_i;  e_i = exp(s_i - mx);  Z = e_0 + e_1 + ... + e_nb (i ascending)
//   a_i = e_i / Z;   h_c = fma(a_nb, v_nb,c, ... fma(a_1, v_1c, fma(a_0, v_0c, 0)))
//   out_c = BF16((h_c · rstd(rowsum fma(h_c, h_c))) · w_c)
// i.e. s_i = q · RMSNorm(v_i; g) and out = RMSNorm(softmax-weighted sources; w).
// exp is CUDA's expf (within 2 ulp; the reference uses std::exp: the one place the
// two may differ).
//
// bind_ahead (the next layer's g', q', eps'; the saved blocks only, nb >= 1):
//   u'_c = g'_c · q'_c;  s'_i = (rowsum fma(v_ic, u'_c)) · rstd'(ss_i)
//   mx' = max s'_i;  e'_i = exp(s'_i - mx');  den = e'_0 + ... + e'_{nb-1}
//   num_c = fma(e'_{nb-1}, v_{nb-1},c, ... fma(e'_0, v_0c, 0))
//   stats[m] = (mx', den), mixture[m, c] = num_c
// so the next layer only merges its own partial (reference/attn_res.hpp).
#pragma once

#include <cuda_runtime.h>

#include "comm/row_norm.cuh"
#include "oproj/oproj_kernels.hpp"

namespace tpdecode::attnres {

using lamport::Fragment;

// Row sums of the first round, at fixed places: ss_i (i <= kMaxBlocks), d_i, d'_i.
inline constexpr int kMaxBlocks = kAttnResMaxBlocks;
inline constexpr int kSs = 0;
inline constexpr int kDot = kMaxBlocks + 1;
inline constexpr int kDotNext = 2 * (kMaxBlocks + 1);
inline constexpr int kSums = kDotNext + kMaxBlocks;

struct Shared {
  rownorm::RowSums<kSums> first;  // every source's ss and d (and d')
  rownorm::RowSumShared norm;     // the output's sum of squares
};

__device__ __forceinline__ float value(const Fragment& f, int j) {
  return j % 2 == 0 ? bf16::low_of(f.w[j / 2]) : bf16::high_of(f.w[j / 2]);
}

// u_c = g_c · q_c for the fragment's 8 columns.
__device__ __forceinline__ void products(const Fragment& g, const Fragment& q, float (&u)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) u[j] = __fmul_rn(value(g, j), value(q, j));
}

// The thread's step of a rowsum: fma(a_c, b_c, s) over its 8 columns in order.
__device__ __forceinline__ float thread_dot(const Fragment& v, const float (&u)[8]) {
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s = __fmaf_rn(value(v, j), u[j], s);
  return s;
}

template <class T>
__device__ __forceinline__ const T* as(const void* p) {
  return static_cast<const T*>(p);
}

// p: the kernel's parameters, by reference (they stay in parameter space).
struct Row {
  const AttnResTail& p;
  int hidden;
  Shared* shared;
  float u[8] = {}, u_next[8] = {};
  Fragment w{}, old{};
  Fragment v[kMaxBlocks] = {};

  __device__ __forceinline__ bool ahead() const { return p.next_query != nullptr; }

  __device__ __forceinline__ void load_params(int frag, bool active) {
    if (!active) return;
    products(as<Fragment>(p.key_norm)[frag], as<Fragment>(p.query)[frag], u);
    w = as<Fragment>(p.out_norm)[frag];
    if (ahead()) products(as<Fragment>(p.next_key_norm)[frag], as<Fragment>(p.next_query)[frag], u_next);
  }

  __device__ __forceinline__ void load_inputs(int, long at, bool active) {
    if (!active) return;
    if (!p.new_block) old = as<Fragment>(p.partial)[at];
#pragma unroll
    for (int i = 0; i < kMaxBlocks; ++i)
      if (i < p.nb) v[i] = as<Fragment>(p.blocks)[i * (p.block_stride / 8) + at];
  }

  // y: the reduced row's fragment (zeros in threads without one). after_barrier:
  // row_collective.cuh's hook, run after the first row sum's CTA barrier.
  template <class Hook>
  __device__ __forceinline__ void finish(const Fragment& y, bool ok, int row, long at, int frag, bool active,
                                         const Hook& after_barrier) {
    const Fragment fresh = p.new_block ? y : rownorm::add_residual(y, old);
    if (active) static_cast<Fragment*>(p.partial_out)[at] = ok ? fresh : lamport::poisoned();
    const int nb = p.nb;
    // Why a copy, not a reference: a reference to v[i] or `fresh` would put both
    // in local memory.
    auto source = [&](int i) { return i < nb ? v[i] : fresh; };

    float s[kSums] = {};
#pragma unroll
    for (int i = 0; i <= kMaxBlocks; ++i) {
      if (i > nb) continue;
      const Fragment src = source(i);
      s[kSs + i] = rownorm::thread_squares(src);
      s[kDot + i] = thread_dot(src, u);
      if (i < nb && ahead()) s[kDotNext + i] = thread_dot(v[i], u_next);
    }
    if (!ok) {  // a failed call: every output of the row NaN
#pragma unroll
      for (int j = 0; j < kSums; ++j) s[j] = __int_as_float(0x7fc00000);
    }
    rownorm::cluster_row_sums(s, kSums, shared->first, true, after_barrier);

    float logit[kMaxBlocks + 1];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i <= kMaxBlocks; ++i) {
      if (i > nb) continue;
      logit[i] = __fmul_rn(s[kDot + i], rownorm::rstd(s[kSs + i], hidden, p.eps));
      mx = fmaxf(mx, logit[i]);
    }
    float z = 0.0f;
#pragma unroll
    for (int i = 0; i <= kMaxBlocks; ++i) {
      if (i > nb) continue;
      logit[i] = expf(__fsub_rn(logit[i], mx));  // e_i
      z = i == 0 ? logit[i] : __fadd_rn(z, logit[i]);
    }
    float h[8] = {};
#pragma unroll
    for (int i = 0; i <= kMaxBlocks; ++i) {
      if (i > nb) continue;
      const float a = __fdiv_rn(logit[i], z);
      const Fragment src = source(i);
#pragma unroll
      for (int j = 0; j < 8; ++j) h[j] = __fmaf_rn(a, value(src, j), h[j]);
    }
    float squares[1] = {0.0f};
#pragma unroll
    for (int j = 0; j < 8; ++j) squares[0] = __fmaf_rn(h[j], h[j], squares[0]);
    rownorm::cluster_row_sums(squares, 1, shared->norm, false);
    const float r = rownorm::rstd(squares[0], hidden, p.eps);
    if (active) {
      Fragment o;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        o.w[j] = bf16::pack_rounded(__fmul_rn(__fmul_rn(h[2 * j], r), value(w, 2 * j)),
                                    __fmul_rn(__fmul_rn(h[2 * j + 1], r), value(w, 2 * j + 1)));
      static_cast<Fragment*>(p.out)[at] = o;
    }
    if (ahead()) finish_ahead(s, row, frag, active);
  }

  // bind_ahead: the next layer's statistics over the saved blocks.
  __device__ __forceinline__ void finish_ahead(const float (&s)[kSums], int row, int frag, bool active) {
    float e[kMaxBlocks];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kMaxBlocks; ++i) {
      if (i >= p.nb) continue;
      e[i] = __fmul_rn(s[kDotNext + i], rownorm::rstd(s[kSs + i], hidden, p.next_eps));
      mx = fmaxf(mx, e[i]);
    }
    float den = 0.0f;
    float num[8] = {};
#pragma unroll
    for (int i = 0; i < kMaxBlocks; ++i) {
      if (i >= p.nb) continue;
      e[i] = expf(__fsub_rn(e[i], mx));
      den = i == 0 ? e[i] : __fadd_rn(den, e[i]);
#pragma unroll
      for (int j = 0; j < 8; ++j) num[j] = __fmaf_rn(e[i], value(v[i], j), num[j]);
    }
    if (active) {
      auto* dst = reinterpret_cast<float4*>(p.mixture + static_cast<long>(row) * hidden + frag * 8);
      dst[0] = make_float4(num[0], num[1], num[2], num[3]);
      dst[1] = make_float4(num[4], num[5], num[6], num[7]);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      p.stats[2 * row] = mx;
      p.stats[2 * row + 1] = den;
    }
  }
};

}  // namespace tpdecode::attnres
