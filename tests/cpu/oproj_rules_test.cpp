// Which o-projection kind serves a call and which one runs (oproj_rules.hpp): the
// refusals of each kind, the rule table (empty: unfused everywhere), forced kinds,
// and the argument checks. Pure host logic: no GPU.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "oproj/oproj_rules.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

// The drafter's o_proj at local TP 8 (H 7168, K 1536), as a PreparedOproj sees it.
OprojLimits tp8() {
  OprojLimits l;
  l.team = TeamKind::kLocal;
  l.team_size = 8;
  l.shares_memory = true;
  l.hidden = 7168;
  l.k = 1536;
  l.rows_cap = 64;
  l.epilogue = OprojEpilogue::kArNorm;
  l.consumer_rows = 6;
  return l;
}

OprojShape shape(int m, int split = 2, int budget = 400) {
  return {m, split, oproj_fused_grid_ctas(7168, split, m), budget};
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

TEST(OprojRules, UnfusedServesEverything) {
  OprojLimits l = tp8();
  l.team_size = 1;
  l.shares_memory = false;
  EXPECT_EQ(oproj_refusal(l, shape(64), OprojKind::kUnfused), "");
}

TEST(OprojRules, MailboxKindsNeedATeamThatSharesMemoryAndAnEngineShape) {
  for (OprojKind kind : {OprojKind::kProducerConsumer, OprojKind::kFused}) {
    SCOPED_TRACE(oproj_kind_name(kind));
    EXPECT_EQ(oproj_refusal(tp8(), shape(1), kind), "");
    OprojLimits l = tp8();
    l.team_size = 1;
    EXPECT_TRUE(contains(oproj_refusal(l, shape(1), kind), "TP 1"));
    l = tp8();
    l.shares_memory = false;
    EXPECT_TRUE(contains(oproj_refusal(l, shape(1), kind), "do not share memory"));
    l = tp8();
    l.hidden = 7200;  // not a multiple of 64
    EXPECT_TRUE(contains(oproj_refusal(l, shape(1), kind), "hidden 7200"));
    l = tp8();
    l.k = 1000;  // not a multiple of 128
    EXPECT_TRUE(contains(oproj_refusal(l, shape(1), kind), "warp split-K engine"));
    l = tp8();
    l.rows_cap = 4;
    EXPECT_TRUE(contains(oproj_refusal(l, shape(5), kind), "mailbox holds 4"));
  }
}

TEST(OprojRules, ProducerConsumerNeedsTheConsumerGridsResident) {
  EXPECT_EQ(oproj_refusal(tp8(), shape(6), OprojKind::kProducerConsumer), "");
  const std::string why = oproj_refusal(tp8(), shape(7), OprojKind::kProducerConsumer);
  EXPECT_TRUE(contains(why, "7 rows")) << why;
  EXPECT_TRUE(contains(why, "can hold 6")) << why;
}

TEST(OprojRules, FusedNeedsItsWholeGridResidentAndItsGeometry) {
  // 112 blocks x split 2 + 8 per row: 232 CTAs at 1 row.
  EXPECT_EQ(oproj_fused_grid_ctas(7168, 2, 1), 232);
  EXPECT_EQ(oproj_refusal(tp8(), shape(8, 2, 288), OprojKind::kFused), "");
  const std::string over = oproj_refusal(tp8(), shape(8, 2, 287), OprojKind::kFused);
  EXPECT_TRUE(contains(over, "288 CTAs per rank")) << over;
  EXPECT_TRUE(contains(over, "can hold 287")) << over;
  EXPECT_TRUE(contains(oproj_refusal(tp8(), shape(17), OprojKind::kFused), "at most 16"));
  OprojLimits wide = tp8();
  wide.hidden = 12288;
  EXPECT_TRUE(contains(oproj_refusal(wide, {1, 1, 0, 1000}, OprojKind::kFused), "hidden 12288"));
  OprojLimits odd = tp8();
  odd.hidden = 7168 - 64 * 3;  // 109 blocks of 64: not whole clusters of 8 at split 1
  EXPECT_TRUE(contains(oproj_refusal(odd, {1, 1, 0, 1000}, OprojKind::kFused), "clusters of 8"));
  EXPECT_EQ(oproj_refusal(odd, {1, 8, 0, 1000}, OprojKind::kFused), "");
  // A block's split CTAs are ranks of one cluster of 8: split 3 (the tuner's choice
  // on some shapes) serves producer-consumer only. 112 x 3 + 8 = 344 CTAs.
  const std::string three = oproj_refusal(tp8(), shape(1, 3, 400), OprojKind::kFused);
  EXPECT_TRUE(contains(three, "split 3 does not divide")) << three;
  EXPECT_EQ(oproj_refusal(tp8(), shape(1, 3, 400), OprojKind::kProducerConsumer), "");
  // Not built for the shape (no budget): refused, never launched.
  EXPECT_FALSE(oproj_refusal(tp8(), shape(1, 2, 0), OprojKind::kFused).empty());
}

TEST(OprojRules, TwoShotNeedsItsMailboxAndWholeOwnerChunks) {
  OprojLimits l = tp8();
  l.two_shot_clusters = 4;  // its consumer clusters loop over rows: any row count
  EXPECT_EQ(oproj_refusal(l, shape(64), OprojKind::kTwoShot), "");
  l.two_shot_clusters = 0;
  EXPECT_TRUE(contains(oproj_refusal(l, shape(1), OprojKind::kTwoShot), "no two-shot mailbox"));
  l = tp8();
  l.two_shot_clusters = 4;
  l.team_size = 16;
  l.hidden = 7232;  // 904 fragments: not whole chunks for 16 owners
  EXPECT_TRUE(contains(oproj_refusal(l, shape(1), OprojKind::kTwoShot), "whole fragments over 16 owners"));
  l = tp8();
  l.two_shot_clusters = 4;
  l.shares_memory = false;
  EXPECT_TRUE(contains(oproj_refusal(l, shape(1), OprojKind::kTwoShot), "do not share memory"));
}

TEST(OprojRules, TheShippedTableIsEmptySoEveryCallRunsUnfused) {
  EXPECT_TRUE(oproj_rule_table().empty());
  const OprojResult r = choose_oproj(tp8(), shape(4), std::nullopt, oproj_rule_table());
  EXPECT_EQ(r.kind, OprojKind::kUnfused);
  EXPECT_TRUE(contains(r.why, "no measured rule")) << r.why;
}

TEST(OprojRules, ATableRuleRunsWhereItMatchesAndServes) {
  const std::vector<OprojRule> table = {
      {TeamKind::kLocal, 8, 7168, 1536, OprojEpilogue::kArNorm, 1, 4, OprojKind::kFused, "test"},
      {TeamKind::kLocal, 8, 7168, 1536, OprojEpilogue::kArNorm, 5, 8, OprojKind::kProducerConsumer, "test"},
  };
  EXPECT_EQ(choose_oproj(tp8(), shape(3), std::nullopt, table).kind, OprojKind::kFused);
  EXPECT_EQ(choose_oproj(tp8(), shape(5), std::nullopt, table).kind, OprojKind::kProducerConsumer);
  // Rows the consumers cannot hold: the rule's kind is refused, unfused runs, and says why.
  const OprojResult r = choose_oproj(tp8(), shape(7), std::nullopt, table);
  EXPECT_EQ(r.kind, OprojKind::kUnfused);
  EXPECT_TRUE(contains(r.why, "consumer grids")) << r.why;
  // Another team, shape or epilogue: no rule.
  OprojLimits other = tp8();
  other.team = TeamKind::kNccl;
  EXPECT_EQ(choose_oproj(other, shape(3), std::nullopt, table).kind, OprojKind::kUnfused);
  other = tp8();
  other.epilogue = OprojEpilogue::kAttnRes;
  EXPECT_EQ(choose_oproj(other, shape(3), std::nullopt, table).kind, OprojKind::kUnfused);
  other = tp8();
  other.k = 3072;
  EXPECT_EQ(choose_oproj(other, shape(3), std::nullopt, table).kind, OprojKind::kUnfused);
  EXPECT_EQ(choose_oproj(tp8(), shape(9), std::nullopt, table).kind, OprojKind::kUnfused);
}

TEST(OprojRules, AForcedKindRunsWhereItServesElseUnfusedWithWhy) {
  EXPECT_EQ(choose_oproj(tp8(), shape(2), OprojKind::kProducerConsumer, {}).kind, OprojKind::kProducerConsumer);
  EXPECT_EQ(choose_oproj(tp8(), shape(2), OprojKind::kUnfused, {}).kind, OprojKind::kUnfused);
  const OprojResult r = choose_oproj(tp8(), shape(2, 2, 16), OprojKind::kFused, {});
  EXPECT_EQ(r.kind, OprojKind::kUnfused);
  EXPECT_TRUE(contains(r.why, "can hold 16")) << r.why;
  EXPECT_EQ(choose_oproj(tp8(), shape(2), OprojKind::kTwoShot, {}).kind, OprojKind::kUnfused);
}

// Fake device addresses: the checks read shapes, dtypes and alignment only.
TensorView fake(int64_t rows, int64_t cols, uintptr_t at = 0x10000) {
  return TensorView::bf16(reinterpret_cast<void*>(at), rows, cols);
}

TEST(OprojRules, ArgumentChecksNameTheProblem) {
  OprojArNormIo a{fake(4, 1536, 1 << 20), fake(4, 7168, 2 << 20), fake(1, 7168, 3 << 20), 1e-6f,
                  fake(4, 7168, 4 << 20), fake(4, 7168, 2 << 20)};  // residual in place
  EXPECT_NO_THROW(check_oproj_io(a, 7168, 1536));
  OprojArNormIo bad = a;
  bad.x = fake(4, 1024, 1 << 20);
  EXPECT_THROW(check_oproj_io(bad, 7168, 1536), InvalidArgument);
  bad = a;
  bad.out = fake(3, 7168, 4 << 20);
  EXPECT_THROW(check_oproj_io(bad, 7168, 1536), InvalidArgument);
  bad = a;
  bad.residual_out = fake(4, 7168, (5 << 20) + 8);  // not 16-byte aligned
  EXPECT_THROW(check_oproj_io(bad, 7168, 1536), InvalidArgument);
  bad = a;
  bad.x = fake(65, 1536, 1 << 20);
  EXPECT_THROW(check_oproj_io(bad, 7168, 1536), InvalidArgument);
  bad = a;
  bad.residual = {};
  EXPECT_NO_THROW(check_oproj_io(bad, 7168, 1536));  // no residual: the new residual is the sum
  for (float eps : {-1e-6f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    bad = a;
    bad.eps = eps;
    EXPECT_THROW(check_oproj_io(bad, 7168, 1536), InvalidArgument) << eps;
  }

  OprojAttnResIo r;
  r.x = fake(2, 1536, 1 << 20);
  r.partial = r.partial_out = fake(2, 7168, 2 << 20);  // in place
  r.out = fake(2, 7168, 3 << 20);
  r.blocks = fake(10, 7168, 4 << 20);  // 5 saved blocks of 2 rows
  r.key_norm = r.query = r.out_norm = fake(1, 7168, 5 << 20);  // read only: may be one
  EXPECT_NO_THROW(check_oproj_io(r, 7168, 1536));
  OprojAttnResIo rb = r;
  rb.blocks = fake(3, 7168, 4 << 20);  // not whole blocks
  EXPECT_THROW(check_oproj_io(rb, 7168, 1536), InvalidArgument);
  rb = r;
  rb.blocks = fake(2 * (kAttnResMaxBlocks + 1), 7168, 4 << 20);
  EXPECT_THROW(check_oproj_io(rb, 7168, 1536), InvalidArgument);
  rb = r;
  rb.blocks = {};
  rb.new_block = true;
  rb.partial = {};
  EXPECT_NO_THROW(check_oproj_io(rb, 7168, 1536));  // nb = 0, a new block: no partial read
  AttnResAhead ahead{fake(1, 7168), fake(1, 7168), 1e-6f, TensorView::f32(reinterpret_cast<void*>(0x20000), 2, 2),
                     TensorView::f32(reinterpret_cast<void*>(0x30000), 2, 7168)};
  rb = r;
  rb.ahead = ahead;
  EXPECT_NO_THROW(check_oproj_io(rb, 7168, 1536));
  rb.ahead->eps = -1.0f;
  EXPECT_THROW(check_oproj_io(rb, 7168, 1536), InvalidArgument);  // the next layer's eps too
  rb.ahead->eps = 1e-6f;
  rb.eps = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(check_oproj_io(rb, 7168, 1536), InvalidArgument);
  rb.eps = 1e-6f;
  rb.blocks = {};
  EXPECT_THROW(check_oproj_io(rb, 7168, 1536), InvalidArgument);  // bind_ahead without saved blocks
  rb = r;
  rb.blocks = fake(-2, 7168, 4 << 20);  // -1 blocks of 2 rows
  EXPECT_THROW(check_oproj_io(rb, 7168, 1536), InvalidArgument);
}

// An output over another operand is refused, but the documented in-place forms
// (residual_out as residual, partial_out as partial, each the same view).
TEST(OprojRules, OutputsOverOtherOperandsAreRefused) {
  const OprojArNormIo a{fake(4, 1536, 1 << 20), fake(4, 7168, 2 << 20), fake(1, 7168, 3 << 20), 1e-6f,
                        fake(4, 7168, 4 << 20), fake(4, 7168, 2 << 20)};
  EXPECT_NO_THROW(check_oproj_io(a, 7168, 1536));
  // The io with one change is refused.
  auto refused_from = [](const auto& io, auto change, const char* what) {
    auto bad = io;
    change(bad);
    EXPECT_THROW(check_oproj_io(bad, 7168, 1536), InvalidArgument) << what;
  };
  auto refused = [&](auto change, const char* what) { refused_from(a, change, what); };
  refused([](OprojArNormIo& b) { b.out = b.residual_out; }, "out as the residual output");
  refused([](OprojArNormIo& b) { b.residual_out = fake(4, 7168, (2 << 20) + 16); }, "residual output shifted");
  refused([](OprojArNormIo& b) { b.out = fake(4, 7168, (1 << 20) + 1024); }, "out over x");
  refused([](OprojArNormIo& b) { b.residual_out = fake(4, 7168, 3 << 20); }, "residual output over the weight");

  OprojAttnResIo r;
  r.x = fake(2, 1536, 1 << 20);
  r.partial = r.partial_out = fake(2, 7168, 2 << 20);
  r.out = fake(2, 7168, 3 << 20);
  r.blocks = fake(10, 7168, 4 << 20);
  r.key_norm = r.query = r.out_norm = fake(1, 7168, 5 << 20);
  r.ahead = AttnResAhead{fake(1, 7168, 5 << 20), fake(1, 7168, 5 << 20), 1e-6f,
                         TensorView::f32(reinterpret_cast<void*>(6 << 20), 2, 2),
                         TensorView::f32(reinterpret_cast<void*>(7 << 20), 2, 7168)};
  EXPECT_NO_THROW(check_oproj_io(r, 7168, 1536));
  auto attn_refused = [&](auto change, const char* what) { refused_from(r, change, what); };
  attn_refused([](OprojAttnResIo& b) { b.out = b.partial_out; }, "out as the partial output");
  attn_refused([](OprojAttnResIo& b) { b.partial_out = fake(2, 7168, (4 << 20) + 2 * 7168 * 2); },
               "the partial output over a saved block");
  attn_refused([](OprojAttnResIo& b) { b.ahead->mixture = TensorView::f32(reinterpret_cast<void*>(3 << 20), 2, 7168); },
               "the ahead mixture over out");
  attn_refused([](OprojAttnResIo& b) { b.out = fake(2, 7168, 5 << 20); }, "out over the norm weights");
  OprojAttnResIo fresh = r;  // a new block reads no partial: partial_out may then lie anywhere but over a read
  fresh.new_block = true;
  fresh.partial = fake(2, 7168, 3 << 20);  // over out, but not read
  EXPECT_NO_THROW(check_oproj_io(fresh, 7168, 1536));
}

}  // namespace
}  // namespace tpdecode
