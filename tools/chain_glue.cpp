#include "chain_glue.hpp"

#include "comm/kernels.hpp"
#include "core/check.hpp"
#include "core/random_fill.hpp"
#include "core/silu_mul_launch.hpp"
#include "drafter/kernels_launch.hpp"

namespace tpdecode::cli {

ChainGlue::ChainGlue(const std::vector<GemmShape>& layer, int layers, int chain_layers, int max_m, bool silu_mul,
                     bool norms, bool fold_norms, cudaStream_t stream)
    : layer_size_(layer.size()),
      q_lora_(layer[kQb].k),
      kv_lora_(512),
      hidden_(layer[kOproj].n),
      intermediate_(layer[kDown].k),
      chain_layers_(chain_layers),
      silu_mul_(silu_mul),
      norms_(norms),
      fold_norms_(fold_norms) {
  check(layer.size() == 5, "bench chain: the glue needs a layer's five GEMMs");
  check(!silu_mul || layer[kGateUp].n == 2 * layer[kDown].k, "bench chain: --silu-mul needs gate_up's N twice down's K");
  check(!norms || (layer[kQkvA].n >= q_lora_ + kv_lora_ && layer[kGateUp].k == hidden_ && layer[kQkvA].k == hidden_ &&
                   layer[kDown].n == hidden_),
        "bench chain: --norms needs the drafter layer's shapes");
  auto buffer = [&](int64_t cols) { return DeviceBuffer(static_cast<std::size_t>(max_m * cols) * 2); };
  for (int l = 0; l < layers; ++l) {
    Layer b;
    if (silu_mul) b.act = buffer(intermediate_);
    if (norms) {
      b.qa = buffer(q_lora_);
      b.kv = buffer(kv_lora_);
      b.hidden = buffer(hidden_);
      b.hidden2 = buffer(hidden_);
    }
    per_layer_.push_back(std::move(b));
  }
  if (norms) {
    residual_ = buffer(hidden_);
    fill_uniform_bf16(residual_.get(), max_m * hidden_, 3, 1.0f, stream);
    uint64_t seed = 11;
    for (auto [w, cols] : {std::pair{&q_norm_, q_lora_}, {&kv_norm_, kv_lora_}, {&post_norm_, hidden_},
                           {&input_norm_, hidden_}}) {
      *w = DeviceBuffer(static_cast<std::size_t>(cols) * 2);
      fill_uniform_bf16(w->get(), cols, seed++, 1.0f, stream);
    }
  }
}

TensorView ChainGlue::view(const DeviceBuffer& b, int m, int64_t cols) const {
  return TensorView::bf16(const_cast<void*>(b.get()), m, cols);
}

TensorView ChainGlue::x(std::size_t i, int m, const TensorView& input) const {
  const Layer& b = layer_of(i);
  switch (position(i)) {
    case kQb: return norms_ ? view(b.qa, m, q_lora_) : input;
    case kGateUp: return norms_ ? view(b.hidden, m, hidden_) : input;
    case kDown: return silu_mul_ ? view(b.act, m, intermediate_) : input;
    case kQkvA: return norms_ ? view(b.hidden2, m, hidden_) : input;
    default: return input;
  }
}

void ChainGlue::before(std::size_t i, int m, const TensorView& previous_out, cudaStream_t stream, bool pdl) const {
  if (!silu_mul_ || position(i) != kDown) return;
  TensorView gate_up = previous_out;
  gate_up.cols = 2 * intermediate_;
  launch_silu_mul(stream, gate_up, x(i, m, {}), pdl);
}

void ChainGlue::after(std::size_t i, int m, const TensorView& out, cudaStream_t stream, bool pdl) const {
  if (!norms_) return;
  const Layer& b = layer_of(i);
  const Position p = position(i);
  if (p == kQkvA) {
    TensorView qa_in = out, kv_in = out;
    qa_in.cols = q_lora_;
    kv_in.data = static_cast<uint16_t*>(out.data) + q_lora_;
    kv_in.cols = kv_lora_;
    const drafter::NormView views[] = {{qa_in, q_norm_.get(), view(b.qa, m, q_lora_)},
                                       {kv_in, kv_norm_.get(), view(b.kv, m, kv_lora_)}};
    drafter::launch_rms_norms(stream, views, eps_, pdl);
  } else if (p == kOproj || p == kDown) {
    NormIo io;
    io.reduced = out.data;
    io.norm = {residual_.get(), (p == kOproj ? post_norm_ : input_norm_).get(),
               (p == kOproj ? b.hidden : b.hidden2).get(), const_cast<void*>(residual_.get()), eps_};
    io.hidden = static_cast<int>(hidden_);
    launch_add_rms_norm(stream, io, m, pdl);
  }
}

bool ChainGlue::silu_epilogue(std::size_t next) const { return silu_mul_ && position(next) == kDown; }

int ChainGlue::append_norms(std::size_t i, int m, int op, const TensorView& out,
                            std::vector<GemmProgram::Op>& ops) const {
  if (!norms_) return op;
  const Layer& b = layer_of(i);
  const Position p = position(i);
  const TensorView residual = view(residual_, m, hidden_);
  auto weight = [](const DeviceBuffer& w, int64_t cols) { return TensorView::bf16(const_cast<void*>(w.get()), 1, cols); };
  if (p == kQkvA) {
    TensorView qa_in = out, kv_in = out;
    qa_in.cols = q_lora_;
    kv_in.data = static_cast<uint16_t*>(out.data) + q_lora_;
    kv_in.cols = kv_lora_;
    ops.push_back(
        GemmProgram::Norm{qa_in, op, weight(q_norm_, q_lora_), eps_, {}, {}, view(b.qa, m, q_lora_), fold_norms_});
    ops.push_back(GemmProgram::Norm{kv_in, op, weight(kv_norm_, kv_lora_), eps_, {}, {}, view(b.kv, m, kv_lora_)});
    return static_cast<int>(ops.size()) - 2;  // q_b reads q_a's norm
  }
  if (p == kOproj || p == kDown) {
    const bool read = p == kOproj || (i / layer_size_) % static_cast<std::size_t>(chain_layers_) + 1 <
                                         static_cast<std::size_t>(chain_layers_);  // by a GEMM of the chain
    ops.push_back(GemmProgram::Norm{out, op, weight(p == kOproj ? post_norm_ : input_norm_, hidden_), eps_, residual,
                                    residual, view(p == kOproj ? b.hidden : b.hidden2, m, hidden_),
                                    fold_norms_ && read});
    return static_cast<int>(ops.size()) - 1;
  }
  return op;
}

}  // namespace tpdecode::cli
