// The drafter step at TP 1 as GemmPrograms: the runs of ops that a program serves
// (GEMMs, the norms, the residual adds, the SiLU-mul as gate_up's epilogue) between
// the ops it does not (the embedding, the attention stand-in, the context add, the
// argmax), cut from the step's op sequence (step.hpp) in step order. Host only: the
// GPU drafter builds a program per segment (gpu_drafter.cpp) and runs the others as
// the specialised path's kernels; the CPU tests check the cut.
#pragma once

#include <functional>
#include <vector>

#include "drafter/config.hpp"
#include "drafter/step.hpp"

namespace tpdecode::drafter {

// One op of a segment, as the step's buffers name it.
struct SegmentOp {
  bool norm = false;  // else a GEMM
  WeightId weight;    // the GEMM's weight, or the norm's
  Slice x;
  int after = -1;     // the op of the segment whose out x is a window of (-1: x an input)
  Slice out;
  // A later op of the segment writes `out` again: this op's out goes to a buffer of
  // the program's own (the same layout), which only the segment's ops read.
  bool out_private = false;
  bool silu_mul = false;      // a GEMM: the SiLU-mul epilogue (out = silu(gate) * up)
  bool residual = false;      // a norm: h = x + the residual buffer
  bool residual_out = false;  // a norm: h into the residual buffer
};
using Segment = std::vector<SegmentOp>;

// A StepOps that cuts the sequence: each run of ops a program serves goes to
// `segment` (its index in the step, its ops) when an op it does not serve comes (or
// at finish()); every other op goes to `launches`, as do segments of a single plain
// GEMM (a program of one op gains nothing over the launch).
class SegmentedStep final : public StepOps {
 public:
  using SegmentSink = std::function<void(int index, const Segment& ops)>;
  SegmentedStep(StepOps& launches, SegmentSink segment) : launches_(launches), segment_(std::move(segment)) {}

  void embed(const Slice& out) override;
  void gemm(WeightId weight, const Slice& x, const Slice& out) override;
  void ar_norm(const Slice& partial, bool first, WeightId norm, const Slice& out) override;
  void rms_norms(std::span<const RowNorm> norms) override;
  void attention(const Slice& q, const Slice& kv, const Slice& k_rope, const Slice& out) override;
  void silu_mul(const Slice& gate_up, const Slice& out) override;
  void gather(GatherKind kind, const Slice& shard, const Slice& out) override;
  void add(const Slice& a, const Slice& b, const Slice& out) override;
  void argmax(const Slice& logits) override;
  // The pending segment, after the step's last op.
  void finish() { flush(); }

 private:
  void append(SegmentOp op);
  void flush();

  StepOps& launches_;
  SegmentSink segment_;
  Segment pending_;
  int segments_ = 0;
};

// Runs the step (run_step) through a SegmentedStep and finishes it.
void run_segmented_step(const DrafterConfig& c, const RankShapes& s, StepOps& launches,
                        const SegmentedStep::SegmentSink& segment);

}  // namespace tpdecode::drafter
