#include "drafter/cpu_reference.hpp"

#include <array>
#include <cmath>

#include "core/bf16.hpp"
#include "reference/ar_norm.hpp"
#include "reference/gemm.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::drafter {

namespace {

constexpr int kNormThreads = 256;  // kernels.cuh's kNormThreads

float f(uint16_t b) { return bf16::to_float(b); }

}  // namespace

int32_t argmax_lowest(std::span<const uint16_t> row) {
  float best = -INFINITY;
  int64_t best_i = static_cast<int64_t>(row.size());
  for (std::size_t i = 0; i < row.size(); ++i) {
    const float v = f(row[i]);
    if (v > best || (v == best && static_cast<int64_t>(i) < best_i)) best = v, best_i = static_cast<int64_t>(i);
  }
  return best_i < static_cast<int64_t>(row.size()) ? static_cast<int32_t>(best_i) : 0;
}

float local_norm_square_sum(std::span<const uint16_t> row) {
  std::array<float, kNormThreads> thread{};
  for (std::size_t c = 0; c < row.size(); ++c) {
    const float v = f(row[c]);
    thread[c % kNormThreads] = std::fma(v, v, thread[c % kNormThreads]);
  }
  float total = 0.0f;
  for (int w = 0; w < kNormThreads / 32; ++w) {
    std::array<float, 32> lane;
    for (int l = 0; l < 32; ++l) lane[static_cast<std::size_t>(l)] = thread[static_cast<std::size_t>(w * 32 + l)];
    for (int o = 16; o >= 1; o /= 2) {
      std::array<float, 32> next;
      for (int l = 0; l < 32; ++l)
        next[static_cast<std::size_t>(l)] = lane[static_cast<std::size_t>(l)] + lane[static_cast<std::size_t>(l ^ o)];
      lane = next;
    }
    total = w == 0 ? lane[0] : total + lane[0];
  }
  return total;
}

CpuReference::CpuReference(const DrafterConfig& config, int64_t rows)
    : config_(config), shapes_(rank_shapes(config, 1)), rows_(rows) {
  require(rows >= 1, "drafter CPU reference: rows must be positive");
  for (int b = 0; b < static_cast<int>(Buf::kCount); ++b)
    buffers_.emplace_back(static_cast<std::size_t>(rows * buffer_cols(config, shapes_, static_cast<Buf>(b))));
  tokens_in_ = step_tokens(config, rows);
  buffers_[static_cast<std::size_t>(Buf::kContextIn)] = host_fill(context_fill(config, rows));
}

void CpuReference::run() { run_step(config_, shapes_, *this); }

const std::vector<uint16_t>& CpuReference::weight(WeightId id) {
  auto it = weights_.find(id.key());
  if (it == weights_.end()) it = weights_.emplace(id.key(), host_fill(weight_fill(config_, id, 1, 0))).first;
  return it->second;
}

uint16_t& CpuReference::at(const Slice& s, int64_t m, int64_t c) {
  const int64_t cols = buffer_cols(config_, shapes_, s.buf);
  return buffers_[static_cast<std::size_t>(s.buf)][static_cast<std::size_t>(m * cols + s.col0 + c)];
}

std::vector<uint16_t> CpuReference::copy_rows(const Slice& s) {
  std::vector<uint16_t> v(static_cast<std::size_t>(rows_ * s.cols));
  for (int64_t m = 0; m < rows_; ++m)
    for (int64_t c = 0; c < s.cols; ++c) v[static_cast<std::size_t>(m * s.cols + c)] = at(s, m, c);
  return v;
}

void CpuReference::embed(const Slice& out) {
  const std::vector<uint16_t>& table = weight({Tensor::kEmbedding, 0});
  for (int64_t m = 0; m < rows_; ++m)
    for (int64_t c = 0; c < out.cols; ++c)
      at(out, m, c) = table[static_cast<std::size_t>(tokens_in_[static_cast<std::size_t>(m)] * config_.hidden + c)];
}

void CpuReference::gemm(WeightId id, const Slice& x, const Slice& out) {
  const std::vector<uint16_t>& w = weight(id);
  const std::vector<uint16_t> y = reference::gemm_bf16_rounded(copy_rows(x), w, rows_, out.cols, x.cols);
  for (int64_t m = 0; m < rows_; ++m)
    for (int64_t n = 0; n < out.cols; ++n) at(out, m, n) = y[static_cast<std::size_t>(m * out.cols + n)];
}

void CpuReference::ar_norm(const Slice& partial, bool first, WeightId norm, const Slice& out) {
  // TP 1: the all-reduce is the partial itself.
  const int64_t h = config_.hidden;
  const std::vector<uint16_t>& w = weight(norm);
  const Slice residual{Buf::kResidual, 0, h};
  for (int64_t m = 0; m < rows_; ++m)
    for (int64_t c = 0; c < h; ++c)
      at(residual, m, c) = first ? at(partial, m, c) : bf16::from_float(f(at(partial, m, c)) + f(at(residual, m, c)));
  const std::vector<uint16_t>& r = buffers_[static_cast<std::size_t>(Buf::kResidual)];
  for (int64_t m = 0; m < rows_; ++m) {
    const std::span<const uint16_t> row(r.data() + m * h, static_cast<std::size_t>(h));
    const float total = reference::ar_norm_square_sum(row);
    const float rstd = reference::ar_norm_rstd(total, h, config_.eps);
    for (int64_t c = 0; c < h; ++c)
      at(out, m, c) = bf16::from_float((f(row[static_cast<std::size_t>(c)]) * rstd) * f(w[static_cast<std::size_t>(c)]));
  }
}

void CpuReference::rms_norms(std::span<const RowNorm> norms) {
  for (const RowNorm& n : norms) {
    const std::vector<uint16_t>& w = weight(n.weight);
    const std::vector<uint16_t> v = copy_rows(n.x);
    const int64_t cols = n.x.cols;
    for (int64_t m = 0; m < rows_; ++m) {
      const std::span<const uint16_t> row(v.data() + m * cols, static_cast<std::size_t>(cols));
      const float rstd = reference::ar_norm_rstd(local_norm_square_sum(row), cols, config_.eps);
      for (int64_t c = 0; c < cols; ++c)
        at(n.out, m, c) = bf16::from_float((f(row[static_cast<std::size_t>(c)]) * rstd) * f(w[static_cast<std::size_t>(c)]));
    }
  }
}

void CpuReference::attention(const Slice& q, const Slice& kv, const Slice& k_rope, const Slice& out) {
  const DrafterConfig& c = config_;
  for (int64_t m = 0; m < rows_; ++m)
    for (int64_t h = 0; h < shapes_.heads; ++h) {
      const int64_t qh = h * c.qk_head();
      float s = 0.0f;
      for (int64_t r = 0; r < c.rope; ++r) s = std::fma(f(at(q, m, qh + c.nope + r)), f(at(k_rope, m, r)), s);
      for (int64_t d = 0; d < c.v_head; ++d)
        at(out, m, h * c.v_head + d) =
            bf16::from_float(std::fma(f(at(q, m, qh + d)), f(at(kv, m, (h * c.v_head + d) % c.kv_lora)), s * 0.125f));
    }
}

void CpuReference::silu_mul(const Slice& gate_up, const Slice& out) {
  for (int64_t m = 0; m < rows_; ++m)
    for (int64_t j = 0; j < out.cols; ++j) {
      const float g = f(at(gate_up, m, j));
      at(out, m, j) = bf16::from_float((g / (1.0f + std::exp(-g))) * f(at(gate_up, m, out.cols + j)));
    }
}

void CpuReference::gather(GatherKind, const Slice&, const Slice&) {
  throw InvalidArgument("drafter CPU reference: TP 1 has no gathers");
}

void CpuReference::add(const Slice& a, const Slice& b, const Slice& out) {
  for (int64_t m = 0; m < rows_; ++m)
    for (int64_t c = 0; c < out.cols; ++c) at(out, m, c) = bf16::from_float(f(at(a, m, c)) + f(at(b, m, c)));
}

void CpuReference::argmax(const Slice& logits) {
  const std::vector<uint16_t> v = copy_rows(logits);
  tokens_out_.resize(static_cast<std::size_t>(rows_));
  for (int64_t m = 0; m < rows_; ++m)
    tokens_out_[static_cast<std::size_t>(m)] =
        argmax_lowest(std::span<const uint16_t>(v.data() + m * logits.cols, static_cast<std::size_t>(logits.cols)));
}

}  // namespace tpdecode::drafter
