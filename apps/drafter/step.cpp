#include "drafter/step.hpp"

#include "tpdecode/error.hpp"

namespace tpdecode::drafter {

int64_t buffer_cols(const DrafterConfig& c, const RankShapes& s, Buf buf) {
  switch (buf) {
    case Buf::kPartial:
    case Buf::kResidual:
    case Buf::kHidden:
    case Buf::kContext:
    case Buf::kHeadIn: return c.hidden;
    case Buf::kQkvA: return c.qkv_a();
    case Buf::kQa: return c.q_lora;
    case Buf::kQ: return s.q;
    case Buf::kKv: return c.kv_lora;
    case Buf::kAttn: return s.attn;
    case Buf::kGateUp: return s.gate_up;
    case Buf::kAct: return s.intermediate;
    case Buf::kContextIn: return c.context_in();
    case Buf::kContextShard: return s.context;
    case Buf::kLogitsShard: return s.vocab;
    case Buf::kLogits: return c.vocab;
    case Buf::kCount: break;
  }
  throw InvalidArgument("drafter: not a buffer");
}

const char* buffer_name(Buf buf) {
  static constexpr const char* kNames[] = {"partial", "residual", "hidden",  "qkv_a",        "q_a",     "q",
                                           "kv",      "attn",     "gate_up", "act",          "ctx_in",  "ctx_shard",
                                           "context", "head_in",  "logits_shard", "logits"};
  static_assert(std::size(kNames) == static_cast<std::size_t>(Buf::kCount));
  return kNames[static_cast<int>(buf)];
}

namespace {

// The op sequence's view of the backend: skips the ops the filter leaves out.
class FilteredOps {
 public:
  FilteredOps(StepOps& ops, const OpFilter& filter) : ops_(ops), f_(filter) {}
  void embed(const Slice& out) {
    if (f_.other) ops_.embed(out);
  }
  void gemm(WeightId w, const Slice& x, const Slice& out) {
    if (f_.gemm) ops_.gemm(w, x, out);
  }
  void ar_norm(const Slice& partial, bool first, WeightId norm, const Slice& out) {
    if (f_.collective) ops_.ar_norm(partial, first, norm, out);
  }
  // Both halves: the backend's (maybe fused) op; one half: that op alone (the
  // breakdown's GEMM-only and collective-only graphs).
  void oproj_ar_norm(WeightId w, const Slice& x, const Slice& partial, WeightId norm, const Slice& out) {
    if (f_.gemm && f_.collective) return ops_.oproj_ar_norm(w, x, partial, norm, out);
    gemm(w, x, partial);
    ar_norm(partial, false, norm, out);
  }
  void rms_norms(std::span<const RowNorm> norms) {
    if (f_.other) ops_.rms_norms(norms);
  }
  void attention(const Slice& q, const Slice& kv, const Slice& k_rope, const Slice& out) {
    if (f_.other) ops_.attention(q, kv, k_rope, out);
  }
  void silu_mul(const Slice& gate_up, const Slice& out) {
    if (f_.other) ops_.silu_mul(gate_up, out);
  }
  void gather(GatherKind kind, const Slice& shard, const Slice& out) {
    if (f_.collective) ops_.gather(kind, shard, out);
  }
  void add(const Slice& a, const Slice& b, const Slice& out) {
    if (f_.other) ops_.add(a, b, out);
  }
  void argmax(const Slice& logits) {
    if (f_.other) ops_.argmax(logits);
  }

 private:
  StepOps& ops_;
  OpFilter f_;
};

}  // namespace

void run_step(const DrafterConfig& c, const RankShapes& s, StepOps& backend, const OpFilter& filter) {
  FilteredOps ops(backend, filter);
  const auto whole = [&](Buf b) { return Slice{b, 0, buffer_cols(c, s, b)}; };

  ops.embed(whole(Buf::kPartial));
  ops.ar_norm(whole(Buf::kPartial), true, {Tensor::kInputNorm, 0}, whole(Buf::kHidden));
  for (int l = 0; l < c.layers; ++l) {
    ops.gemm({Tensor::kQkvA, l}, whole(Buf::kHidden), whole(Buf::kQkvA));
    const RowNorm qkv_norms[] = {{{Buf::kQkvA, 0, c.q_lora}, {Tensor::kQaNorm, l}, whole(Buf::kQa)},
                                 {{Buf::kQkvA, c.q_lora, c.kv_lora}, {Tensor::kKvNorm, l}, whole(Buf::kKv)}};
    ops.rms_norms(qkv_norms);
    ops.gemm({Tensor::kQB, l}, whole(Buf::kQa), whole(Buf::kQ));
    ops.attention(whole(Buf::kQ), whole(Buf::kKv), {Buf::kQkvA, c.q_lora + c.kv_lora, c.rope}, whole(Buf::kAttn));
    ops.oproj_ar_norm({Tensor::kOProj, l}, whole(Buf::kAttn), whole(Buf::kPartial), {Tensor::kPostAttentionNorm, l},
                      whole(Buf::kHidden));
    ops.gemm({Tensor::kGateUp, l}, whole(Buf::kHidden), whole(Buf::kGateUp));
    ops.silu_mul(whole(Buf::kGateUp), whole(Buf::kAct));
    ops.gemm({Tensor::kDown, l}, whole(Buf::kAct), whole(Buf::kPartial));
    // The next layer's input norm; after the last layer, the final norm (layer index `layers`).
    ops.ar_norm(whole(Buf::kPartial), false, {Tensor::kInputNorm, l + 1}, whole(Buf::kHidden));
  }
  const bool sharded = s.tp > 1;
  ops.gemm({Tensor::kContextProj, 0}, whole(Buf::kContextIn), whole(sharded ? Buf::kContextShard : Buf::kContext));
  if (sharded) ops.gather(GatherKind::kContext, whole(Buf::kContextShard), whole(Buf::kContext));
  ops.add(whole(Buf::kHidden), whole(Buf::kContext), whole(Buf::kHeadIn));
  ops.gemm({Tensor::kLmHead, 0}, whole(Buf::kHeadIn), whole(sharded ? Buf::kLogitsShard : Buf::kLogits));
  if (sharded) ops.gather(GatherKind::kLogits, whole(Buf::kLogitsShard), whole(Buf::kLogits));
  ops.argmax(whole(Buf::kLogits));
}

namespace {

class CountingOps final : public StepOps {
 public:
  CountingOps(const DrafterConfig& config, int tp) : config_(config), tp_(tp) {}
  StepOpCounts n;
  void embed(const Slice&) override { ++n.others; }
  void gemm(WeightId w, const Slice&, const Slice&) override {
    ++n.gemms;
    read(w);
  }
  void ar_norm(const Slice&, bool, WeightId norm, const Slice&) override {
    ++n.ar_norms;
    read(norm);
  }
  void rms_norms(std::span<const RowNorm> norms) override {
    for (const RowNorm& r : norms) {
      ++n.norms;
      read(r.weight);
    }
  }
  void attention(const Slice&, const Slice&, const Slice&, const Slice&) override { ++n.others; }
  void silu_mul(const Slice&, const Slice&) override { ++n.others; }
  void gather(GatherKind, const Slice&, const Slice&) override { ++n.gathers; }
  void add(const Slice&, const Slice&, const Slice&) override { ++n.others; }
  void argmax(const Slice&) override { ++n.others; }

 private:
  // Rank 0's shard: every rank's is as large (rank_shapes refuses uneven splits).
  void read(WeightId w) {
    const ShardMap m = weight_fill(config_, w, tp_, 0).map;
    n.weight_bytes += m.rows * m.cols * static_cast<int64_t>(sizeof(uint16_t));  // bf16
  }
  const DrafterConfig& config_;
  int tp_;
};

}  // namespace

StepOpCounts count_step_ops(const DrafterConfig& c, int tp) {
  CountingOps ops(c, tp);
  run_step(c, rank_shapes(c, tp), ops);
  return ops.n;
}

}  // namespace tpdecode::drafter
