#include "drafter/gpu_step_ops.hpp"

#include <fmt/format.h>

#include "comm/stock_comm_launch.hpp"
#include "drafter/kernels_launch.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::drafter {

GpuStepOps::GpuStepOps(const DrafterConfig& config, const RankShapes& shapes,
                       const std::vector<std::unique_ptr<GpuRank>>& ranks, DrafterComm* comm, StockComm* stock,
                       DrafterPath path, int m)
    : config_(config), shapes_(shapes), ranks_(ranks), comm_(comm), stock_(stock), path_(path), m_(m),
      shared_gpu_(ranks.at(0)->ctx.ranks_on_device > 1) {}

bool GpuStepOps::pdl() const {
  // Why off when ranks share a GPU (the local team): with it, specialised steps timed
  // out at local TP 8 with 1 row and in the local TP 4 test with 28; without it, 1 and
  // 7 rows ran at TP 8 (measured). Our reading, not proven: a kernel launched early
  // holds SMs while it waits at griddepcontrol.wait, outside the collectives'
  // co-residency accounting, so a peer rank's kernel can be starved while a
  // collective spins on it. Where each rank has its own GPU (TP 1, the NCCL team)
  // PDL stays on.
  return specialised() && !shared_gpu_;
}

bool GpuStepOps::offer_to_comm() const { return comm_ && specialised(); }

void GpuStepOps::embed(const Slice& out) {
  const bool pdl = this->pdl();
  for (const auto& r : ranks_)
    launch_embed(r->ctx.stream, static_cast<const int32_t*>(r->tokens_in.get()), r->weight({Tensor::kEmbedding, 0}),
                 r->vocab0, r->view(out, m_), pdl);
}

void GpuStepOps::gemm(WeightId weight, const Slice& x, const Slice& out) {
  const bool pdl = this->pdl();
  for (const auto& r : ranks_) {
    if (specialised()) {
      DecodeGemm& g = *r->gemms.at(weight.key());
      g.set_pdl(pdl);
      g.run(r->view(x, m_), r->view(out, m_), r->ctx.stream);
    } else {
      r->cublas->gemm(r->view(x, m_), r->weight(weight), r->view(out, m_), r->ctx.stream);
    }
  }
}

void GpuStepOps::ar_norm(const Slice& partial, bool first, WeightId norm, const Slice& out, int parity) {
  std::vector<ArNormIo> io;
  for (const auto& r : ranks_) {
    ArNormIo a;
    a.x = r->view(partial, m_);
    if (!first) a.residual = r->view({Buf::kResidual, 0, config_.hidden}, m_);
    a.weight = r->weight(norm);
    a.eps = config_.eps;
    a.out = r->view(out, m_);
    a.residual_out = r->view({Buf::kResidual, 0, config_.hidden}, m_);
    io.push_back(a);
  }
  if (shapes_.tp == 1) {
    // Why: one rank's all-reduce is the identity; both paths run the norm alone.
    for (std::size_t i = 0; i < ranks_.size(); ++i) launch_add_rms_norm(ranks_[i]->ctx.stream, io[i].x.data, io[i]);
    return;
  }
  if (offer_to_comm() && comm_->ar_norm(0, io[0], parity)) {
    for (std::size_t i = 1; i < ranks_.size(); ++i)
      require(comm_->ar_norm(static_cast<int>(i), io[i], parity),
              fmt::format("drafter: ar_norm served on driven rank 0 but not on {}", i));
    return;
  }
  stock_->ar_norm(io);
}

void GpuStepOps::rms_norm(const Slice& x, WeightId norm, const Slice& out) {
  const bool pdl = this->pdl();
  for (const auto& r : ranks_)
    launch_rms_norm(r->ctx.stream, r->view(x, m_), r->weight(norm).data, config_.eps, r->view(out, m_), pdl);
}

void GpuStepOps::attention(const Slice& q, const Slice& kv, const Slice& k_rope, const Slice& out) {
  const bool pdl = this->pdl();
  for (const auto& r : ranks_) {
    AttentionShape a;
    a.heads = static_cast<int>(shapes_.heads);
    a.head0 = static_cast<int>(r->ctx.rank * shapes_.heads);
    a.nope = static_cast<int>(config_.nope);
    a.rope = static_cast<int>(config_.rope);
    a.v_head = static_cast<int>(config_.v_head);
    a.kv_lora = static_cast<int>(config_.kv_lora);
    launch_attention(r->ctx.stream, r->view(q, m_), r->view(kv, m_), r->view(k_rope, m_), r->view(out, m_), a, pdl);
  }
}

void GpuStepOps::silu_mul(const Slice& gate_up, const Slice& out) {
  const bool pdl = this->pdl();
  for (const auto& r : ranks_) launch_silu_mul(r->ctx.stream, r->view(gate_up, m_), r->view(out, m_), pdl);
}

void GpuStepOps::gather(GatherKind kind, const Slice& shard, const Slice& out, int parity) {
  std::vector<TensorView> shards, outs;
  for (const auto& r : ranks_) {
    shards.push_back(r->view(shard, m_));
    outs.push_back(r->view(out, m_));
  }
  const auto served = [&](int i) {
    return kind == GatherKind::kContext ? comm_->gather_context(i, shards[static_cast<std::size_t>(i)],
                                                                outs[static_cast<std::size_t>(i)], parity)
                                        : comm_->gather_logits(i, shards[static_cast<std::size_t>(i)],
                                                               outs[static_cast<std::size_t>(i)], parity);
  };
  if (offer_to_comm() && served(0)) {
    for (int i = 1; i < static_cast<int>(ranks_.size()); ++i)
      require(served(i), fmt::format("drafter: gather served on driven rank 0 but not on {}", i));
    return;
  }
  stock_->all_gather(shards, outs);
}

void GpuStepOps::add(const Slice& a, const Slice& b, const Slice& out) {
  const bool pdl = this->pdl();
  for (const auto& r : ranks_)
    launch_add(r->ctx.stream, r->view(a, m_), r->view(b, m_), r->view(out, m_), pdl);
}

void GpuStepOps::argmax(const Slice& logits) {
  const bool pdl = this->pdl();
  for (const auto& r : ranks_)
    launch_argmax(r->ctx.stream, r->view(logits, m_), static_cast<int32_t*>(r->tokens_out.get()), pdl);
}

}  // namespace tpdecode::drafter
