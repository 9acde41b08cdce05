// The drafter step as GemmPrograms: the runs of ops that a program serves (GEMMs,
// the norms, the residual adds, at TP > 1 the all-reduce + norms, the SiLU-mul as
// gate_up's epilogue) between the ops it does not (the embedding, the attention
// stand-in, the gathers, the context add, the argmax), cut from the step's op
// sequence (step.hpp) in step order. Host only: the GPU drafter builds a program per
// segment (gpu_drafter.cpp: a TeamProgram, one GemmProgram per rank) and runs the
// others as the specialised path's kernels; the CPU tests check the cut.
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
  // A norm folded into the GEMMs of the segment that read it (GemmProgram::Norm::
  // folded): its x a GEMM's out, only GEMMs of the segment read its out, and nothing
  // reads that out after the segment before it is written again or the step ends.
  bool folded = false;
  // A norm at TP > 1: x is the rank's partial, summed over the team first
  // (GemmProgram::Norm::all_reduce, in a TeamProgram); never folded.
  bool all_reduce = false;
};
using Segment = std::vector<SegmentOp>;

// A StepOps that cuts the sequence: each run of ops a program serves becomes a
// segment, which ends where an op it does not serve comes; every other op is a
// launch, as is a segment of a single plain GEMM (a program of one op gains nothing
// over the launch). At finish(), once the whole step is known (which norms can fold),
// the segments go to `segment` (its index in the step, its ops) and the launches to
// `launches`, in step order.
class SegmentedStep final : public StepOps {
 public:
  using SegmentSink = std::function<void(int index, const Segment& ops)>;
  // all_reduces: the step's all-reduce + norms are the team's (TP > 1), else the
  // residual add + norm alone (TP 1).
  SegmentedStep(StepOps& launches, SegmentSink segment, bool all_reduces = false)
      : launches_(launches), segment_(std::move(segment)), all_reduces_(all_reduces) {}

  void embed(const Slice& out) override;
  void gemm(WeightId weight, const Slice& x, const Slice& out) override;
  void ar_norm(const Slice& partial, bool first, WeightId norm, const Slice& out) override;
  void rms_norms(std::span<const RowNorm> norms) override;
  void attention(const Slice& q, const Slice& kv, const Slice& k_rope, const Slice& out) override;
  void silu_mul(const Slice& gate_up, const Slice& out) override;
  void gather(GatherKind kind, const Slice& shard, const Slice& out) override;
  void add(const Slice& a, const Slice& b, const Slice& out) override;
  void argmax(const Slice& logits) override;
  // After the step's last op: the folds, then every segment and launch in order.
  void finish();

 private:
  // A segment (its index) or a launch, with the slices it reads and writes.
  struct Event {
    int segment = -1;
    std::function<void()> launch;
    std::vector<Slice> reads;
    std::vector<Slice> writes;
  };
  void append(SegmentOp op);
  void flush();
  void later(std::function<void()> launch, std::vector<Slice> reads, std::vector<Slice> writes);
  void fold(std::size_t event);
  // Whether nothing from event `from` (op `op` of a segment on) reads `out` before
  // something writes all of it again or the step ends (a step's results are its
  // logits and tokens).
  bool dead_after(const Slice& out, std::size_t from, std::size_t op) const;

  StepOps& launches_;
  SegmentSink segment_;
  bool all_reduces_;
  Segment pending_;
  std::vector<Segment> segments_;
  std::vector<Event> events_;
};

// Runs the step (run_step) through a SegmentedStep (all-reduces where s.tp > 1) and
// finishes it.
void run_segmented_step(const DrafterConfig& c, const RankShapes& s, StepOps& launches,
                        const SegmentedStep::SegmentSink& segment);

}  // namespace tpdecode::drafter
