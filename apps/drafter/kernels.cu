// Launchers of the drafter step's kernels (kernels.cuh).
#include <algorithm>
#include <string>

#include "core/launch.cuh"
#include "drafter/kernels.cuh"
#include "drafter/kernels_launch.hpp"

namespace tpdecode::drafter {

namespace {

kernels::Rows rows_of(const TensorView& t) { return {static_cast<__nv_bfloat16*>(t.data), t.row_stride}; }

LaunchShape elementwise(int64_t n, bool pdl) {
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>((n + kernels::kElementThreads - 1) / kernels::kElementThreads));
  s.block = dim3(kernels::kElementThreads);
  s.pdl = pdl;
  return s;
}

}  // namespace

void launch_fill(cudaStream_t stream, void* out, const FillSpec& f) {
  const int64_t n = f.map.rows * f.map.cols;
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 8192)));
  s.block = dim3(256);
  launch_kernel(kernels::fill_kernel, s, stream, static_cast<__nv_bfloat16*>(out), f.map.rows, f.map.cols, f.map.row0,
                f.map.block_rows, f.map.block_stride, f.map.col0, f.seed, f.key, f.scale, f.bias);
}

void launch_embed(cudaStream_t stream, const int32_t* tokens, const TensorView& table, int64_t vocab0,
                  const TensorView& out, bool pdl) {
  const int frags = static_cast<int>(out.cols / 8);
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>((frags + 127) / 128), static_cast<unsigned>(out.rows));
  s.block = dim3(128);
  s.pdl = pdl;
  launch_kernel(kernels::embed_kernel, s, stream, tokens, static_cast<const uint4*>(table.data), table.rows, vocab0,
                static_cast<uint4*>(out.data), frags);
}

void launch_rms_norms(cudaStream_t stream, std::span<const NormView> norms, float eps, bool pdl) {
  if (norms.empty() || norms.size() > kernels::kMaxNorms)
    throw InvalidArgument("rms_norms: 1 to " + std::to_string(kernels::kMaxNorms) + " norms per launch");
  kernels::Norms k{};
  for (std::size_t i = 0; i < norms.size(); ++i) {
    const NormView& n = norms[i];
    if (n.x.rows != norms[0].x.rows) throw InvalidArgument("rms_norms: the norms' inputs differ in rows");
    k.norm[i] = {rows_of(n.x), static_cast<const __nv_bfloat16*>(n.weight), rows_of(n.out), static_cast<int>(n.x.cols)};
  }
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(norms[0].x.rows), static_cast<unsigned>(norms.size()));
  s.block = dim3(kernels::kNormThreads);
  s.pdl = pdl;
  launch_kernel(kernels::rms_norm_kernel, s, stream, k, eps);
}

void launch_attention(cudaStream_t stream, const TensorView& q, const TensorView& kv, const TensorView& k_rope,
                      const TensorView& out, const AttentionShape& a, bool pdl) {
  const auto rows = static_cast<int>(q.rows);
  launch_kernel(kernels::attention_kernel, elementwise(static_cast<int64_t>(rows) * a.heads * a.v_head, pdl), stream,
                rows_of(q), rows_of(kv), rows_of(k_rope), rows_of(out), rows, a.heads, a.head0, a.nope, a.rope,
                a.v_head, a.kv_lora);
}

void launch_add(cudaStream_t stream, const TensorView& a, const TensorView& b, const TensorView& out, bool pdl) {
  launch_kernel(kernels::add_kernel, elementwise(out.rows * out.cols, pdl), stream, rows_of(a), rows_of(b),
                rows_of(out), static_cast<int>(out.rows), static_cast<int>(out.cols));
}

void launch_argmax(cudaStream_t stream, const TensorView& logits, int32_t* tokens, bool pdl) {
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(logits.rows));
  s.block = dim3(kernels::kArgmaxThreads);
  s.pdl = pdl;
  launch_kernel(kernels::argmax_kernel, s, stream, rows_of(logits), static_cast<int>(logits.cols), tokens);
}

}  // namespace tpdecode::drafter
