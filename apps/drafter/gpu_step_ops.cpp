#include "drafter/gpu_step_ops.hpp"

#include <fmt/format.h>

#include "core/silu_mul_launch.hpp"
#include "drafter/kernels_launch.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::drafter {

GpuStepOps::GpuStepOps(const DrafterConfig& config, const RankShapes& shapes,
                       const std::vector<std::unique_ptr<GpuRank>>& ranks, TpComm& comm,
                       const std::vector<std::unique_ptr<PreparedOproj>>& oprojs, DrafterPath path, int m,
                       bool shared_gpu)
    : config_(config),
      shapes_(shapes),
      ranks_(ranks),
      comm_(comm),
      oprojs_(oprojs),
      path_(path),
      m_(m),
      shared_gpu_(shared_gpu) {
  for (const auto& r : ranks_) streams_.push_back(r->stream);
}

void GpuStepOps::note(const CommResult& r) {
  ++paths_[static_cast<int>(r.path)];
  if (r.path == CommPath::kStock && first_why_.empty()) first_why_ = r.why;
}

std::string GpuStepOps::comm_paths() const {
  std::string out;
  for (CommPath p : {CommPath::kOneShot, CommPath::kTwoShot, CommPath::kStock}) {
    const int n = paths_[static_cast<int>(p)];
    if (n == 0) continue;
    out += fmt::format("{}{} {}", out.empty() ? "" : ", ", comm_path_name(p), n);
  }
  for (OprojKind k : {OprojKind::kProducerConsumer, OprojKind::kFused, OprojKind::kTwoShot, OprojKind::kUnfused}) {
    const int n = oproj_kinds_[static_cast<int>(k)];
    if (n > 0) out += fmt::format("{}oproj {} {}", out.empty() ? "" : ", ", oproj_kind_name(k), n);
  }
  if (!first_why_.empty()) out += fmt::format(" ({})", first_why_);
  if (!oproj_why_.empty()) out += fmt::format(" (oproj: {})", oproj_why_);
  return out.empty() ? "none" : out;
}

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

void GpuStepOps::embed(const Slice& out) {
  const bool pdl = this->pdl();
  for (const auto& r : ranks_)
    launch_embed(r->stream, static_cast<const int32_t*>(r->tokens_in.get()), r->weight({Tensor::kEmbedding, 0}),
                 r->vocab0, r->view(out, m_), pdl);
}

void GpuStepOps::gemm(WeightId weight, const Slice& x, const Slice& out) {
  const bool pdl = this->pdl();
  for (const auto& r : ranks_) {
    if (specialised()) {
      DecodeGemm& g = *r->gemms.at(weight.key());
      g.set_pdl(pdl);
      g.set_chain(pdl);  // a link of the step's chain of PDL kernels
      g.run(r->view(x, m_), r->view(out, m_), r->stream);
    } else {
      r->cublas->gemm(r->view(x, m_), r->weight(weight), r->view(out, m_), r->stream);
    }
  }
}

void GpuStepOps::ar_norm(const Slice& partial, bool first, WeightId norm, const Slice& out) {
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
  note(comm_.ar_norm(io, streams_));
}

void GpuStepOps::oproj_ar_norm(WeightId weight, const Slice& x, const Slice& partial, WeightId norm,
                               const Slice& out) {
  PreparedOproj* op = specialised() && !oprojs_.empty() ? oprojs_.at(static_cast<std::size_t>(weight.layer)).get() : nullptr;
  // Where the rule table (or a forced kind) has nothing fused for m rows, or m was
  // not prepared: the two ops as before.
  const OprojResult plan = op && op->prepared(m_) ? op->plan(m_) : OprojResult{};
  if (plan.kind == OprojKind::kUnfused) {
    if (op && !plan.why.empty() && oproj_why_.empty()) oproj_why_ = plan.why;
    if (op) ++oproj_kinds_[static_cast<int>(OprojKind::kUnfused)];
    StepOps::oproj_ar_norm(weight, x, partial, norm, out);
    return;
  }
  std::vector<OprojArNormIo> io;
  for (const auto& r : ranks_) {
    const TensorView residual = r->view({Buf::kResidual, 0, config_.hidden}, m_);
    io.push_back({r->view(x, m_), residual, r->weight(norm), config_.eps, r->view(out, m_), residual});
  }
  ++oproj_kinds_[static_cast<int>(op->run(io, streams_).kind)];
}

void GpuStepOps::rms_norms(std::span<const RowNorm> norms) {
  const bool pdl = this->pdl();
  for (const auto& r : ranks_) {
    std::vector<NormView> views;
    for (const RowNorm& n : norms) views.push_back({r->view(n.x, m_), r->weight(n.weight).data, r->view(n.out, m_)});
    launch_rms_norms(r->stream, views, config_.eps, pdl);
  }
}

void GpuStepOps::attention(const Slice& q, const Slice& kv, const Slice& k_rope, const Slice& out) {
  const bool pdl = this->pdl();
  for (const auto& r : ranks_) {
    AttentionShape a;
    a.heads = static_cast<int>(shapes_.heads);
    a.head0 = static_cast<int>(r->rank * shapes_.heads);
    a.nope = static_cast<int>(config_.nope);
    a.rope = static_cast<int>(config_.rope);
    a.v_head = static_cast<int>(config_.v_head);
    a.kv_lora = static_cast<int>(config_.kv_lora);
    launch_attention(r->stream, r->view(q, m_), r->view(kv, m_), r->view(k_rope, m_), r->view(out, m_), a, pdl);
  }
}

void GpuStepOps::silu_mul(const Slice& gate_up, const Slice& out) {
  const bool pdl = this->pdl();
  for (const auto& r : ranks_) launch_silu_mul(r->stream, r->view(gate_up, m_), r->view(out, m_), pdl);
}

void GpuStepOps::gather(GatherKind, const Slice& shard, const Slice& out) {
  std::vector<GatherIo> io;
  for (const auto& r : ranks_) io.push_back({r->view(shard, m_), r->view(out, m_)});
  note(comm_.gather(io, streams_));
}

void GpuStepOps::add(const Slice& a, const Slice& b, const Slice& out) {
  const bool pdl = this->pdl();
  for (const auto& r : ranks_)
    launch_add(r->stream, r->view(a, m_), r->view(b, m_), r->view(out, m_), pdl);
}

void GpuStepOps::argmax(const Slice& logits) {
  const bool pdl = this->pdl();
  for (const auto& r : ranks_)
    launch_argmax(r->stream, r->view(logits, m_), static_cast<int32_t*>(r->tokens_out.get()), pdl);
}

}  // namespace tpdecode::drafter
