// The drafter step at TP 1 cut into GemmProgram segments (program_segments.hpp): the
// runs of ops, their windows, private outs, SiLU-mul epilogues and residual stream,
// and what still runs as kernels.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "drafter/program_segments.hpp"

namespace tpdecode::drafter {
namespace {

// The launches' names, in order.
class Launches final : public StepOps {
 public:
  std::vector<std::string> names;
  void embed(const Slice&) override { names.push_back("embed"); }
  void gemm(WeightId w, const Slice&, const Slice&) override { names.push_back("gemm " + std::to_string(w.key())); }
  void ar_norm(const Slice&, bool, WeightId, const Slice&) override { names.push_back("ar_norm"); }
  void rms_norms(std::span<const RowNorm>) override { names.push_back("rms_norms"); }
  void attention(const Slice&, const Slice&, const Slice&, const Slice&) override { names.push_back("attention"); }
  void silu_mul(const Slice&, const Slice&) override { names.push_back("silu_mul"); }
  void gather(GatherKind, const Slice&, const Slice&) override { names.push_back("gather"); }
  void add(const Slice&, const Slice&, const Slice&) override { names.push_back("add"); }
  void argmax(const Slice&) override { names.push_back("argmax"); }
};

struct Cut {
  Launches launches;
  std::vector<Segment> segments;
  explicit Cut(const DrafterConfig& c, int tp = 1) {
    run_segmented_step(c, rank_shapes(c, tp), launches, [&](int index, const Segment& s) {
      EXPECT_EQ(index, static_cast<int>(segments.size()));
      segments.push_back(s);
    });
  }
};

bool same(const Slice& a, const Slice& b) { return a.buf == b.buf && a.col0 == b.col0 && a.cols == b.cols; }

TEST(ProgramSegments, TheStepAtTp1) {
  const DrafterConfig c = DrafterConfig::reference();
  const Cut cut(c);
  // embed, an attention per layer, the context add, the lm_head (one GEMM: a
  // launch), the argmax.
  std::vector<std::string> want = {"embed"};
  for (int l = 0; l < c.layers; ++l) want.push_back("attention");
  want.insert(want.end(), {"add", "gemm " + std::to_string(WeightId{Tensor::kLmHead, 0}.key()), "argmax"});
  EXPECT_EQ(cut.launches.names, want);
  ASSERT_EQ(cut.segments.size(), static_cast<std::size_t>(c.layers + 1));
  // Segment 0: the first norm (no residual, the stream's start), qkv_a, the q_a and
  // kv norms of its windows, q_b of the q_a norm.
  const Segment& first = cut.segments[0];
  ASSERT_EQ(first.size(), 5u);
  EXPECT_TRUE(first[0].norm && !first[0].residual && first[0].residual_out && first[0].after == -1);
  EXPECT_TRUE(!first[1].norm && first[1].weight == (WeightId{Tensor::kQkvA, 0}) && first[1].after == 0);
  EXPECT_TRUE(first[2].norm && first[2].after == 1 && same(first[2].x, {Buf::kQkvA, 0, c.q_lora}));
  EXPECT_TRUE(first[3].norm && first[3].after == 1 && same(first[3].x, {Buf::kQkvA, c.q_lora, c.kv_lora}));
  EXPECT_TRUE(!first[4].norm && first[4].after == 2);
  // Folded: the q_a norm (q_b reads it); not the first norm (its x an input) nor kv's
  // (the attention reads it).
  EXPECT_TRUE(!first[0].folded && first[2].folded && !first[3].folded);
  // Segments 1 .. layers-1: o_proj, its norm, gate_up (SiLU-mul epilogue into the
  // activation), down, its norm, the next layer's qkv_a, two norms, q_b.
  for (int l = 1; l < c.layers; ++l) {
    SCOPED_TRACE(testing::Message() << "segment " << l);
    const Segment& s = cut.segments[static_cast<std::size_t>(l)];
    ASSERT_EQ(s.size(), 9u);
    EXPECT_TRUE(s[0].weight == (WeightId{Tensor::kOProj, l - 1}) && s[0].after == -1 && s[0].out_private);
    EXPECT_TRUE(s[1].norm && s[1].residual && s[1].residual_out && s[1].after == 0 && s[1].out_private);
    EXPECT_TRUE(s[2].silu_mul && s[2].after == 1 && same(s[2].out, {Buf::kAct, 0, c.intermediate}));
    EXPECT_TRUE(s[3].weight == (WeightId{Tensor::kDown, l - 1}) && s[3].after == 2 && !s[3].out_private);
    EXPECT_TRUE(s[4].norm && s[4].residual && s[4].after == 3 && !s[4].out_private);
    EXPECT_TRUE(s[5].weight == (WeightId{Tensor::kQkvA, l}) && s[5].after == 4);
    EXPECT_TRUE(s[6].after == 5 && s[7].after == 5 && s[8].after == 6);
    EXPECT_TRUE(s[1].folded);
    EXPECT_TRUE(s[4].folded);
    EXPECT_TRUE(s[6].folded);
    EXPECT_FALSE(s[7].folded);
  }
  // The last: o_proj, norm, gate_up, down, the final norm, the context projection
  // (an input).
  const Segment& last = cut.segments.back();
  ASSERT_EQ(last.size(), 6u);
  EXPECT_TRUE(last[4].norm && last[4].weight == (WeightId{Tensor::kInputNorm, c.layers}));
  EXPECT_TRUE(last[5].weight == (WeightId{Tensor::kContextProj, 0}) && last[5].after == -1);
  EXPECT_TRUE(last[1].folded && !last[4].folded) << "the final norm: the context add reads it";
  // No op of a segment writes what another reads from memory; outs written twice
  // are private but for the last writer.
  for (const Segment& s : cut.segments)
    for (std::size_t i = 0; i < s.size(); ++i)
      for (std::size_t j = 0; j < s.size(); ++j) {
        const bool overlaps = s[i].out.buf == s[j].x.buf && s[i].out.col0 < s[j].x.col0 + s[j].x.cols &&
                              s[j].x.col0 < s[i].out.col0 + s[i].out.cols;
        if (s[j].after < 0) EXPECT_FALSE(overlaps) << "op " << i << " writes op " << j << "'s input";
      }
}

// At TP 8 the same segments, but every all-reduce + norm (the norms with a residual
// stream) sums the team's partials inside its program (all_reduce) and never folds;
// the q_a norms still fold into q_b; the gathers are launches. At TP 1 no norm
// all-reduces.
TEST(ProgramSegments, TheStepAtTp8AllReducesInsideThePrograms) {
  const DrafterConfig c = DrafterConfig::reference();
  const Cut cut(c, 8);
  std::vector<std::string> want = {"embed"};
  for (int l = 0; l < c.layers; ++l) want.push_back("attention");
  want.insert(want.end(), {"gather", "add", "gemm " + std::to_string(WeightId{Tensor::kLmHead, 0}.key()), "gather",
                           "argmax"});
  EXPECT_EQ(cut.launches.names, want);
  ASSERT_EQ(cut.segments.size(), static_cast<std::size_t>(c.layers + 1));
  int all_reduces = 0;
  for (const Segment& seg : cut.segments)
    for (const SegmentOp& op : seg) {
      EXPECT_EQ(op.all_reduce, op.norm && op.residual_out) << "only the residual stream's norms all-reduce";
      EXPECT_FALSE(op.all_reduce && op.folded);
      all_reduces += op.all_reduce;
    }
  EXPECT_EQ(all_reduces, 1 + 2 * c.layers) << "the embedding's, and per layer the o_proj's and the down's";
  for (int l = 1; l < c.layers; ++l) EXPECT_TRUE(cut.segments[static_cast<std::size_t>(l)][6].folded) << "q_a norm";
  const Cut tp1(c);
  for (const Segment& seg : tp1.segments)
    for (const SegmentOp& op : seg) EXPECT_FALSE(op.all_reduce);
}

// A SiLU-mul that does not follow its gate_up GEMM runs as the kernel.
TEST(ProgramSegments, ASiluMulWithoutItsGemmIsALaunch) {
  Launches launches;
  std::vector<Segment> segments;
  SegmentedStep step(launches, [&](int, const Segment& s) { segments.push_back(s); });
  step.gemm({Tensor::kGateUp, 0}, {Buf::kHidden, 0, 64}, {Buf::kGateUp, 0, 128});
  step.gemm({Tensor::kQkvA, 0}, {Buf::kHidden, 0, 64}, {Buf::kQkvA, 0, 64});
  step.silu_mul({Buf::kGateUp, 0, 128}, {Buf::kAct, 0, 64});
  step.finish();
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_FALSE(segments[0][0].silu_mul);
  EXPECT_EQ(launches.names, (std::vector<std::string>{"silu_mul"}));
}

// A norm folds only where nothing reads its out after the segment before it is
// written again or the step ends: a launch reading it first keeps it.
TEST(ProgramSegments, ANormFoldsOnlyWhereItsOutIsDeadAfterTheSegment) {
  const Slice hidden{Buf::kHidden, 0, 128}, partial{Buf::kPartial, 0, 128};
  for (int reader : {0, 1, 2}) {  // 0: written again; 1: a launch reads it first; 2: the step ends
    SCOPED_TRACE(testing::Message() << "case " << reader);
    Launches launches;
    std::vector<Segment> segments;
    SegmentedStep step(launches, [&](int, const Segment& s) { segments.push_back(s); });
    step.gemm({Tensor::kOProj, 0}, {Buf::kAttn, 0, 64}, partial);
    step.ar_norm(partial, false, {Tensor::kPostAttentionNorm, 0}, hidden);
    step.gemm({Tensor::kGateUp, 0}, hidden, {Buf::kGateUp, 0, 256});
    if (reader == 1) step.add(hidden, {Buf::kContext, 0, 128}, {Buf::kHeadIn, 0, 128});
    if (reader != 2) step.embed(hidden);  // writes all of it
    step.finish();
    ASSERT_EQ(segments.size(), 1u);
    ASSERT_EQ(segments[0].size(), 3u);
    EXPECT_EQ(segments[0][1].folded, reader != 1);
  }
  // A norm read by a norm of its segment does not fold.
  Launches launches;
  std::vector<Segment> segments;
  SegmentedStep step(launches, [&](int, const Segment& s) { segments.push_back(s); });
  step.gemm({Tensor::kOProj, 0}, {Buf::kAttn, 0, 64}, partial);
  step.ar_norm(partial, false, {Tensor::kPostAttentionNorm, 0}, hidden);
  const RowNorm again[] = {{hidden, {Tensor::kQaNorm, 0}, {Buf::kQa, 0, 128}}};
  step.rms_norms(again);
  step.gemm({Tensor::kGateUp, 0}, hidden, {Buf::kGateUp, 0, 256});
  step.embed(hidden);
  step.finish();
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_FALSE(segments[0][1].folded);
}

}  // namespace
}  // namespace tpdecode::drafter
