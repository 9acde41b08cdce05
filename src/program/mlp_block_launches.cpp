#include "program/mlp_block_launches.hpp"

#include <cstdint>

#include "comm/kernels.hpp"
#include "core/check.hpp"
#include "core/silu_mul_launch.hpp"
#include "tpdecode/comm.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::program {

namespace {

bool given(const TensorView& t) { return t.data != nullptr; }
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
// A [rows, H] tensor the norm kernel reads or writes: contiguous, 16-byte aligned.
bool norm_rows(const TensorView& t, int64_t hidden) { return t.row_stride == hidden && aligned16(t.data); }

}  // namespace

bool launches_serve(const MlpBlockProgram::Weights& w, const MlpBlockProgram::Buffers& b) {
  const int64_t hidden = b.residual.cols;
  if (!ar_norm_hidden_served(hidden) || !norm_rows(b.residual, hidden) || !aligned16(w.post_norm.data)) return false;
  if (!given(w.o_proj) && !norm_rows(b.attn, hidden)) return false;  // the post norm's input
  if (given(w.next_norm) && (!aligned16(w.next_norm.data) || (!given(w.qkv) && !norm_rows(b.out, hidden))))
    return false;  // the next norm's weight, and its out where it is the block's
  return true;
}

MlpLinear mlp_linear(const TensorView& w, int m, const std::shared_ptr<CublasContext>& cublas) {
  MlpLinear l;
  if (!given(w)) return l;
  const auto row_bytes = static_cast<std::size_t>(w.cols) * 2;
  l.weight = DeviceBuffer(static_cast<std::size_t>(w.rows) * row_bytes);
  TPD_CUDA(cudaMemcpy2D(l.weight.get(), row_bytes, w.data, static_cast<std::size_t>(w.row_stride) * 2, row_bytes,
                        static_cast<std::size_t>(w.rows), cudaMemcpyDeviceToDevice));
  l.gemm = std::make_unique<DecodeGemm>(TensorView::bf16(l.weight.get(), w.rows, w.cols), cublas);
  // Between PDL kernels (the norm and SiLU-mul kernels launch as dependents): a
  // chain link's decision.
  l.gemm->set_chain(true);
  l.gemm->prepare(m);
  return l;
}

MlpBlockLaunches::MlpBlockLaunches(const MlpBlockProgram::Weights& w, const MlpBlockProgram::Buffers& b,
                                   const MlpBlockScratch& s, int m)
    : w_(w), b_(b), s_(s), m_(m), cublas_(std::make_shared<CublasContext>()) {
  check(launches_serve(w, b),
        "mlp block: the launch form does not serve these tensors (its norm kernel takes H a multiple of 64 up to "
        "16384, the norms' [m, H] inputs and outputs contiguous and 16-byte aligned, their weights 16-byte aligned)");
  gate_up_out_ = DeviceBuffer(static_cast<std::size_t>(m) * static_cast<std::size_t>(w.gate_up.rows) * 2);
  gate_up_view_ = TensorView::bf16(gate_up_out_.get(), m, w.gate_up.rows);
  down_out_ = given(w.next_norm) ? s.y : b.out;
  // The weights may still be written on the caller's streams.
  TPD_CUDA(cudaDeviceSynchronize());
  o_proj_ = mlp_linear(w.o_proj, m, cublas_);
  gate_up_ = mlp_linear(w.gate_up, m, cublas_);
  down_ = mlp_linear(w.down, m, cublas_);
  qkv_ = mlp_linear(w.qkv, m, cublas_);
  // Each GEMM's operands as run() hands them (InvalidArgument here, not in a run).
  if (o_proj_.gemm) o_proj_.gemm->path(b.attn, s.o);
  gate_up_.gemm->path(s.h, gate_up_view_);
  down_.gemm->path(s.act, down_out_);
  if (qkv_.gemm) qkv_.gemm->path(s.h2, b.out);
  // The copies (on the legacy stream) before any run on a stream that does not wait for it.
  TPD_CUDA(cudaDeviceSynchronize());
}

void MlpBlockLaunches::run(cudaStream_t stream, bool pdl) const {
  const int64_t hidden = b_.residual.cols;
  for (const MlpLinear* l : {&o_proj_, &gate_up_, &down_, &qkv_})
    if (l->gemm && l->gemm->pdl() != pdl) l->gemm->set_pdl(pdl);
  // residual += x; out = rmsnorm(residual) * weight (residual in place).
  auto add_norm = [&](const TensorView& x, const TensorView& weight, const TensorView& out) {
    const NormIo io{x.data, ArNormTail{b_.residual.data, weight.data, out.data, b_.residual.data, w_.eps},
                    static_cast<int>(hidden)};
    launch_add_rms_norm(stream, io, m_, pdl);
  };
  if (o_proj_.gemm) o_proj_.gemm->run(b_.attn, s_.o, stream);
  add_norm(o_proj_.gemm ? s_.o : b_.attn, w_.post_norm, s_.h);
  gate_up_.gemm->run(s_.h, gate_up_view_, stream);
  launch_silu_mul(stream, gate_up_view_, s_.act, pdl);
  down_.gemm->run(s_.act, down_out_, stream);
  if (!given(w_.next_norm)) return;
  add_norm(s_.y, w_.next_norm, qkv_.gemm ? s_.h2 : b_.out);
  if (qkv_.gemm) qkv_.gemm->run(s_.h2, b_.out, stream);
}

}  // namespace tpdecode::program
