#include "drafter/program_segments.hpp"

namespace tpdecode::drafter {

namespace {

bool overlap(const Slice& a, const Slice& b) {
  return a.buf == b.buf && a.col0 < b.col0 + b.cols && b.col0 < a.col0 + a.cols;
}
bool inside(const Slice& x, const Slice& out) {
  return x.buf == out.buf && x.col0 >= out.col0 && x.col0 + x.cols <= out.col0 + out.cols;
}

}  // namespace

void SegmentedStep::append(SegmentOp op) {
  // The op whose out x is a window of: the latest writer of x's columns in the segment.
  for (int j = static_cast<int>(pending_.size()) - 1; j >= 0 && op.after < 0; --j) {
    const SegmentOp& w = pending_[static_cast<std::size_t>(j)];
    if (!overlap(w.out, op.x)) continue;
    if (inside(op.x, w.out)) {
      op.after = j;
    } else {  // a partial overlap no window expresses: x from memory, in a new segment
      flush();
      break;
    }
  }
  // An op may not write what an op of the segment reads from memory (the program
  // reads its inputs while ops write): such an op starts a new segment.
  for (const SegmentOp& r : pending_)
    if (r.after < 0 && overlap(r.x, op.out)) {
      flush();
      op.after = -1;
      break;
    }
  pending_.push_back(op);
}

void SegmentedStep::flush() {
  if (pending_.empty()) return;
  Segment ops = std::move(pending_);
  pending_.clear();
  if (ops.size() == 1 && !ops[0].norm && !ops[0].silu_mul) {
    launches_.gemm(ops[0].weight, ops[0].x, ops[0].out);
    return;
  }
  for (std::size_t i = 0; i < ops.size(); ++i)
    for (std::size_t j = i + 1; j < ops.size(); ++j)
      if (overlap(ops[i].out, ops[j].out)) ops[i].out_private = true;
  segment_(segments_++, ops);
}

void SegmentedStep::embed(const Slice& out) {
  flush();
  launches_.embed(out);
}

void SegmentedStep::gemm(WeightId weight, const Slice& x, const Slice& out) {
  SegmentOp op;
  op.weight = weight;
  op.x = x;
  op.out = out;
  append(op);
}

void SegmentedStep::ar_norm(const Slice& partial, bool first, WeightId norm, const Slice& out) {
  // TP 1: the all-reduce is the partial itself; the residual stream is the residual
  // buffer (read unless first, always written).
  SegmentOp op;
  op.norm = true;
  op.weight = norm;
  op.x = partial;
  op.out = out;
  op.residual = !first;
  op.residual_out = true;
  append(op);
}

void SegmentedStep::rms_norms(std::span<const RowNorm> norms) {
  for (const RowNorm& n : norms) {
    SegmentOp op;
    op.norm = true;
    op.weight = n.weight;
    op.x = n.x;
    op.out = n.out;
    append(op);
  }
}

void SegmentedStep::attention(const Slice& q, const Slice& kv, const Slice& k_rope, const Slice& out) {
  flush();
  launches_.attention(q, kv, k_rope, out);
}

void SegmentedStep::silu_mul(const Slice& gate_up, const Slice& out) {
  // The epilogue of the GEMM that just wrote gate_up, else the kernel.
  if (!pending_.empty() && !pending_.back().norm && !pending_.back().silu_mul && pending_.back().out.buf == gate_up.buf &&
      pending_.back().out.col0 == gate_up.col0 && pending_.back().out.cols == gate_up.cols) {
    pending_.back().silu_mul = true;
    pending_.back().out = out;
    return;
  }
  flush();
  launches_.silu_mul(gate_up, out);
}

void SegmentedStep::gather(GatherKind kind, const Slice& shard, const Slice& out) {
  flush();
  launches_.gather(kind, shard, out);
}

void SegmentedStep::add(const Slice& a, const Slice& b, const Slice& out) {
  flush();
  launches_.add(a, b, out);
}

void SegmentedStep::argmax(const Slice& logits) {
  flush();
  launches_.argmax(logits);
}

void run_segmented_step(const DrafterConfig& c, const RankShapes& s, StepOps& launches,
                        const SegmentedStep::SegmentSink& segment) {
  SegmentedStep step(launches, segment);
  run_step(c, s, step);
  step.finish();
}

}  // namespace tpdecode::drafter
