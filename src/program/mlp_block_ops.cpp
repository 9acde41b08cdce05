#include "program/mlp_block_ops.hpp"

#include <cmath>
#include <cstdint>

#include "core/check.hpp"
#include "core/tensor_overlap.hpp"
#include "tpdecode/gemm_decision.hpp"

namespace tpdecode::program {

namespace {

bool given(const TensorView& t) { return t.data != nullptr; }

void need(const TensorView& t, int64_t rows, int64_t cols, const char* what) {
  check(given(t), "mlp block: {} is missing", what);
  check(t.dtype == DType::kBF16, "mlp block: {} must be bf16 (it is {})", what, t.describe());
  check(t.rows == rows && t.cols == cols, "mlp block: {} must be [{}, {}] (it is {})", what, rows, cols,
        t.describe());
}

}  // namespace

MlpBlockWidths check_mlp_block(const MlpBlockProgram::Weights& w, const MlpBlockProgram::Buffers& b, int m) {
  check(m >= 1 && m <= kGemmMaxRows, "mlp block: {} rows (1 to {})", m, kGemmMaxRows);
  check(given(b.residual), "mlp block: the residual is missing");
  const int64_t hidden = b.residual.cols;
  need(b.residual, m, hidden, "the residual");
  check(given(w.gate_up), "mlp block: gate_up is missing");
  check(w.gate_up.rows % 2 == 0, "mlp block: gate_up must have an even number of rows, gate then up ({})",
        w.gate_up.describe());
  const int64_t inter = w.gate_up.rows / 2;
  need(w.gate_up, 2 * inter, hidden, "gate_up");
  need(w.down, hidden, inter, "down");
  need(w.post_norm, 1, hidden, "post_norm");
  // Why here: the launch form's norm kernels take eps as given (the program checks
  // its own).
  check(std::isfinite(w.eps) && w.eps >= 0, "mlp block: eps {} (a finite number >= 0 is required)", w.eps);
  if (given(w.o_proj)) {
    need(w.o_proj, hidden, w.o_proj.cols, "o_proj");
    need(b.attn, m, w.o_proj.cols, "attn ([m, A] with o_proj [H, A])");
  } else {
    need(b.attn, m, hidden, "attn (no o_proj: the block's input, [m, H])");
  }
  if (given(w.next_norm)) need(w.next_norm, 1, hidden, "next_norm");
  check(!given(w.qkv) || given(w.next_norm), "mlp block: qkv reads the next norm's out: give next_norm");
  if (given(w.qkv)) need(w.qkv, w.qkv.rows, hidden, "qkv");
  need(b.out, m, given(w.qkv) ? w.qkv.rows : hidden, given(w.qkv) ? "out ([m, Q])" : "out ([m, H])");
  // The block writes out and the residual while it reads attn (either form).
  check_writes_apart("mlp block", {{&b.out, "out"}, {&b.residual, "the residual"}}, {{&b.attn, "attn"}});
  return {hidden, inter};
}

MlpBlockOps mlp_block_ops(const MlpBlockProgram::Weights& w, const MlpBlockProgram::Buffers& b,
                          const MlpBlockScratch& s, MlpBlockNorms norms) {
  using P = GemmProgram;
  const bool fold = norms == MlpBlockNorms::kFold;
  auto norm = [&](const TensorView& x, int after, const TensorView& weight, const TensorView& out, bool folds) {
    P::Norm n{x, after, weight, w.eps, b.residual, b.residual, out, folds};
    n.all_reduce = norms == MlpBlockNorms::kAllReduce;
    return n;
  };
  MlpBlockOps r;
  auto& ops = r.ops;
  auto last = [&] { return static_cast<int>(ops.size()) - 1; };
  // residual += o; h = rmsnorm(residual) * post_norm (residual in place).
  if (given(w.o_proj)) {
    ops.push_back(P::Gemm{w.o_proj, b.attn, s.o});
    ops.push_back(norm(s.o, last(), w.post_norm, s.h, fold));
  } else {
    ops.push_back(norm(b.attn, -1, w.post_norm, s.h, false));
  }
  r.post_norm = last();
  ops.push_back(P::Gemm{w.gate_up, s.h, s.act, last(), P::Epilogue::kSiluMul});
  const bool next = given(w.next_norm);
  ops.push_back(P::Gemm{w.down, s.act, next ? s.y : b.out, last()});
  if (!next) return r;
  // residual += y; h' = rmsnorm(residual) * next_norm: its residual is the post norm's
  // residual_out (the stream), which a folded norm may read only from a folded norm.
  const bool qkv = given(w.qkv);
  const bool folds = fold && qkv && ops[static_cast<std::size_t>(r.post_norm)].norm.folded;
  ops.push_back(norm(s.y, last(), w.next_norm, qkv ? s.h2 : b.out, folds));
  r.next_norm = last();
  if (qkv) ops.push_back(P::Gemm{w.qkv, s.h2, b.out, last()});
  return r;
}

}  // namespace tpdecode::program
