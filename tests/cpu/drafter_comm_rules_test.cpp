// DrafterComm's served / not-served rules, as pure functions (no GPU).
#include <gtest/gtest.h>

#include "tpdecode/drafter_comm.hpp"

namespace tpdecode {
namespace {

// Device addresses are never dereferenced by the rules; any aligned value will do.
void* fake(std::uintptr_t offset = 0) { return reinterpret_cast<void*>(0x100000 + offset); }

DrafterCommLimits tp8_limits() {
  DrafterCommLimits l;
  l.team_size = 8;
  l.hidden = 7168;
  l.rows_cap = 64;
  l.context_rows_cap = 64;
  l.vocab_shard = 20480;
  l.ar_norm_resident_rows = 32;
  l.gather_resident_rows = 64;
  return l;
}

ArNormIo io_for(int64_t rows, int64_t hidden = 7168) {
  ArNormIo io;
  io.x = TensorView::bf16(fake(), rows, hidden);
  io.residual = TensorView::bf16(fake(), rows, hidden);
  io.weight = TensorView::bf16(fake(), 1, hidden);
  io.out = TensorView::bf16(fake(), rows, hidden);
  io.residual_out = TensorView::bf16(fake(), rows, hidden);
  return io;
}

TEST(DrafterCommRules, ArNormServesBf16RowsUpToWhatFits) {
  const DrafterCommLimits l = tp8_limits();
  EXPECT_EQ(ar_norm_refusal(l, io_for(1)), "");
  EXPECT_EQ(ar_norm_refusal(l, io_for(32)), "");
  ArNormIo none = io_for(8);
  none.residual = TensorView{};
  EXPECT_EQ(ar_norm_refusal(l, none), "") << "residual none is served";
  EXPECT_NE(ar_norm_refusal(l, io_for(33)).find("hold"), std::string::npos);  // above what the GPU holds
  EXPECT_NE(ar_norm_refusal(l, io_for(0)), "");
  DrafterCommLimits roomy = l;
  roomy.ar_norm_resident_rows = 1000;
  EXPECT_EQ(ar_norm_refusal(roomy, io_for(64)), "");
  EXPECT_NE(ar_norm_refusal(roomy, io_for(65)), "");  // above the mailbox
  EXPECT_NE(ar_norm_refusal(l, io_for(4, 4096)), "");  // hidden not the built one
}

TEST(DrafterCommRules, ArNormRefusesOtherDtypesLayoutsAndShapes) {
  const DrafterCommLimits l = tp8_limits();
  ArNormIo f32 = io_for(4);
  f32.x.dtype = DType::kF32;
  EXPECT_NE(ar_norm_refusal(l, f32), "");
  ArNormIo res = io_for(4);
  res.residual.dtype = DType::kF32;
  EXPECT_NE(ar_norm_refusal(l, res), "");
  ArNormIo strided = io_for(4);
  strided.out.row_stride = 8192;
  EXPECT_NE(ar_norm_refusal(l, strided), "");
  ArNormIo misaligned = io_for(4);
  misaligned.x.data = fake(2);
  EXPECT_NE(ar_norm_refusal(l, misaligned), "");
  ArNormIo weight = io_for(4);
  weight.weight.rows = 2;
  EXPECT_NE(ar_norm_refusal(l, weight), "");
  ArNormIo rows = io_for(4);
  rows.residual_out.rows = 3;
  EXPECT_NE(ar_norm_refusal(l, rows), "");
  ArNormIo null = io_for(4);
  null.out.data = nullptr;
  EXPECT_NE(ar_norm_refusal(l, null), "");
}

TEST(DrafterCommRules, GathersServeTheirShardWidthsOnly) {
  const DrafterCommLimits l = tp8_limits();
  const TensorView ctx_shard = TensorView::bf16(fake(), 16, 896);
  EXPECT_EQ(gather_context_refusal(l, ctx_shard, TensorView::bf16(fake(), 16, 7168)), "");
  EXPECT_NE(gather_context_refusal(l, TensorView::bf16(fake(), 16, 512), TensorView::bf16(fake(), 16, 4096)), "");
  EXPECT_NE(gather_context_refusal(l, ctx_shard, TensorView::bf16(fake(), 16, 7000)), "");
  EXPECT_NE(gather_context_refusal(l, TensorView::bf16(fake(), 65, 896), TensorView::bf16(fake(), 65, 7168)), "");
  TensorView f32 = TensorView::f32(fake(), 16, 896);
  EXPECT_NE(gather_context_refusal(l, f32, TensorView::f32(fake(), 16, 7168)), "");

  EXPECT_EQ(gather_logits_refusal(l, TensorView::bf16(fake(), 64, 20480), TensorView::bf16(fake(), 64, 163840)), "");
  EXPECT_NE(gather_logits_refusal(l, TensorView::bf16(fake(), 4, 20000), TensorView::bf16(fake(), 4, 160000)), "");
  DrafterCommLimits no_logits = l;
  no_logits.vocab_shard = 0;
  EXPECT_NE(gather_logits_refusal(no_logits, TensorView::bf16(fake(), 4, 20480), TensorView::bf16(fake(), 4, 163840)),
            "");
  DrafterCommLimits tight = l;
  tight.gather_resident_rows = 8;
  EXPECT_NE(gather_logits_refusal(tight, TensorView::bf16(fake(), 9, 20480), TensorView::bf16(fake(), 9, 163840)), "");
}

TEST(DrafterCommRules, BuildNeedsASupportedTeamAndHidden) {
  DrafterCommConfig c;
  EXPECT_NE(drafter_comm_build_refusal(1, c), "");
  EXPECT_NE(drafter_comm_build_refusal(3, c), "");
  EXPECT_EQ(drafter_comm_build_refusal(2, c), "");
  EXPECT_EQ(drafter_comm_build_refusal(8, c), "");
  EXPECT_EQ(drafter_comm_build_refusal(16, c), "");
  c.hidden = 6144;
  EXPECT_NE(drafter_comm_build_refusal(8, c), "");
  c.hidden = 4096;
  c.rows_cap = 0;
  EXPECT_NE(drafter_comm_build_refusal(8, c), "");
}

}  // namespace
}  // namespace tpdecode
