#include "drafter/program_segments.hpp"

#include "tpdecode/gemm_program.hpp"

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
    const SegmentOp g = ops[0];
    later([this, g] { launches_.gemm(g.weight, g.x, g.out); }, {g.x}, {g.out});
    return;
  }
  for (std::size_t i = 0; i < ops.size(); ++i)
    for (std::size_t j = i + 1; j < ops.size(); ++j)
      if (overlap(ops[i].out, ops[j].out)) ops[i].out_private = true;
  Event e;
  e.segment = static_cast<int>(segments_.size());
  segments_.push_back(std::move(ops));
  events_.push_back(std::move(e));
}

void SegmentedStep::later(std::function<void()> launch, std::vector<Slice> reads, std::vector<Slice> writes) {
  events_.push_back({-1, std::move(launch), std::move(reads), std::move(writes)});
}

bool SegmentedStep::dead_after(const Slice& out, std::size_t from, std::size_t op) const {
  auto covers = [](const Slice& w, const Slice& o) {
    return w.buf == o.buf && w.col0 <= o.col0 && w.col0 + w.cols >= o.col0 + o.cols;
  };
  for (std::size_t e = from; e < events_.size(); ++e) {
    const Event& ev = events_[e];
    if (ev.segment < 0) {
      for (const Slice& r : ev.reads)
        if (overlap(r, out)) return false;
      for (const Slice& w : ev.writes)
        if (covers(w, out)) return true;
      for (const Slice& w : ev.writes)
        if (overlap(w, out)) return false;
      continue;
    }
    const Segment& seg = segments_[static_cast<std::size_t>(ev.segment)];
    for (std::size_t j = e == from ? op : 0; j < seg.size(); ++j) {
      if (overlap(seg[j].x, out)) return false;
      if (covers(seg[j].out, out)) return true;
      if (overlap(seg[j].out, out)) return false;
    }
  }
  return true;  // the step's results are its logits and tokens, which its launches write
}

void SegmentedStep::fold(std::size_t event) {
  Segment& seg = segments_[static_cast<std::size_t>(events_[event].segment)];
  int stream = -1;  // the segment's latest norm that wrote the residual stream
  for (std::size_t j = 0; j < seg.size(); ++j) {
    SegmentOp& n = seg[j];
    if (!n.norm) continue;
    if (n.all_reduce) {  // its x is a partial: every column of every rank before the sum
      if (n.residual_out) stream = static_cast<int>(j);
      continue;
    }
    const int previous_stream = stream;
    if (n.residual_out) stream = static_cast<int>(j);
    if (n.after < 0) continue;
    const SegmentOp& producer = seg[static_cast<std::size_t>(n.after)];
    const int64_t column = n.x.col0 - producer.out.col0;
    if (producer.norm || producer.silu_mul || !GemmProgram::folds_window(column, n.x.cols, producer.out.cols))
      continue;
    // A norm that adds publishes x + residual in its producer's place; its residual
    // stream an input or a folded norm's.
    const bool adds = n.residual || n.residual_out;
    bool shared = false;
    for (std::size_t k = 0; k < seg.size(); ++k) shared |= k != j && seg[k].after == n.after;
    if (adds && shared) continue;
    if (n.residual && previous_stream >= 0 && !seg[static_cast<std::size_t>(previous_stream)].folded) continue;
    // GEMMs of the segment read it (through `after`), nothing else until it is dead.
    int readers = 0;
    bool other = false;
    std::size_t k = j + 1;
    for (; k < seg.size() && !other; ++k) {
      if (overlap(seg[k].x, n.out)) {
        if (seg[k].norm || seg[k].after != static_cast<int>(j)) other = true;
        else ++readers;
      }
      if (overlap(seg[k].out, n.out)) break;
    }
    if (other || readers == 0) continue;
    if (k == seg.size() ? !dead_after(n.out, event + 1, 0) : !dead_after(n.out, event, k)) continue;
    n.folded = true;
  }
}

void SegmentedStep::finish() {
  flush();
  for (std::size_t e = 0; e < events_.size(); ++e)
    if (events_[e].segment >= 0) fold(e);
  for (const Event& e : events_) {
    if (e.segment >= 0) segment_(e.segment, segments_[static_cast<std::size_t>(e.segment)]);
    else e.launch();
  }
}

void SegmentedStep::embed(const Slice& out) {
  flush();
  later([this, out] { launches_.embed(out); }, {}, {out});
}

void SegmentedStep::gemm(WeightId weight, const Slice& x, const Slice& out) {
  SegmentOp op;
  op.weight = weight;
  op.x = x;
  op.out = out;
  append(op);
}

void SegmentedStep::ar_norm(const Slice& partial, bool first, WeightId norm, const Slice& out) {
  // The residual stream is the residual buffer (read unless first, always written);
  // at TP 1 the all-reduce is the partial itself.
  SegmentOp op;
  op.norm = true;
  op.all_reduce = all_reduces_;
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
  later([=, this] { launches_.attention(q, kv, k_rope, out); }, {q, kv, k_rope}, {out});
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
  later([=, this] { launches_.silu_mul(gate_up, out); }, {gate_up}, {out});
}

void SegmentedStep::gather(GatherKind kind, const Slice& shard, const Slice& out) {
  flush();
  later([=, this] { launches_.gather(kind, shard, out); }, {shard}, {out});
}

void SegmentedStep::add(const Slice& a, const Slice& b, const Slice& out) {
  flush();
  later([=, this] { launches_.add(a, b, out); }, {a, b}, {out});
}

void SegmentedStep::argmax(const Slice& logits) {
  flush();
  later([=, this] { launches_.argmax(logits); }, {logits}, {});
}

void run_segmented_step(const DrafterConfig& c, const RankShapes& s, StepOps& launches,
                        const SegmentedStep::SegmentSink& segment) {
  SegmentedStep step(launches, segment, s.tp > 1);
  run_step(c, s, step);
  step.finish();
}

}  // namespace tpdecode::drafter
