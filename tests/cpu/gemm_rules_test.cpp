// DecodeGemm's host rules (seed 004 eligibility, the tactic rule, which operands
// the engine takes) and the FP64 reference GEMM the device tests trust.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "tpdecode/bf16.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/gemm_tactic.hpp"
#include "reference/gemm.hpp"

namespace tpdecode {
namespace {

constexpr int kH200Sms = 132;

TEST(GemmRules, EligibilityFollowsSeed004) {
  EXPECT_TRUE(warp_eligible(2112, 7168));     // fused_qkv_a: 56 tiles of 128
  EXPECT_TRUE(warp_eligible(16, 128));
  EXPECT_TRUE(warp_eligible(16, 8192));       // 64 tiles of 128
  EXPECT_FALSE(warp_eligible(16, 8320));      // 65 tiles of 128, K % 256 != 0
  EXPECT_TRUE(warp_eligible(16, 8448));       // 33 tiles of 256
  EXPECT_TRUE(warp_eligible(7168, 12288));    // TP1 o_proj: 48 tiles of 256
  EXPECT_TRUE(warp_eligible(16, 16384));      // 64 tiles of 256
  EXPECT_FALSE(warp_eligible(16, 16640));     // 65 tiles of 256
  EXPECT_FALSE(warp_eligible(7168, 18432));   // TP1 down: 72 tiles of 256
  EXPECT_FALSE(warp_eligible(896, 35840));    // context projection: 140 tiles of 256
  EXPECT_FALSE(warp_eligible(2120, 7168));    // N % 16 != 0
  EXPECT_FALSE(warp_eligible(2112, 7200));    // K % 128 != 0
  EXPECT_FALSE(warp_eligible(0, 128));
  EXPECT_FALSE(warp_eligible(16, 0));
}

TEST(GemmRules, TokenTilesCoverRows) {
  EXPECT_EQ(warp_token_tiles(1), 1);
  EXPECT_EQ(warp_token_tiles(8), 1);
  EXPECT_EQ(warp_token_tiles(9), 2);
  EXPECT_EQ(warp_token_tiles(16), 2);
  EXPECT_EQ(warp_token_tiles(17), 4);
  EXPECT_EQ(warp_token_tiles(32), 4);
  EXPECT_THROW(warp_token_tiles(0), InvalidArgument);
  EXPECT_THROW(warp_token_tiles(33), InvalidArgument);
}

TEST(GemmRules, SeveralCtasFitOnAnSm) {
  for (int tiles : {1, 2, 4}) {
    EXPECT_LE(warp_smem_bytes(tiles), 227 * 1024);
    EXPECT_GE(warp_ctas_per_sm(tiles), 2) << tiles;
  }
}

TEST(GemmRules, TacticOnReferenceShapes) {
  // The splits measured fastest on an H200 (docs/performance.md), M <= 8.
  EXPECT_EQ(choose_tactic(2112, 7168, 1, kH200Sms).split, 8);   // 33 blocks: K split fills the SMs
  EXPECT_EQ(choose_tactic(4608, 7168, 8, kH200Sms).split, 4);
  EXPECT_EQ(choose_tactic(7168, 2304, 1, kH200Sms).split, 2);
  EXPECT_EQ(choose_tactic(18432, 1536, 1, kH200Sms).split, 1);  // 288 blocks
  // 576 blocks are 1.45 rounds of 396 resident CTAs; split 2 makes 2.9.
  EXPECT_EQ(choose_tactic(36864, 7168, 1, kH200Sms).split, 2);
  const GemmTactic t = choose_tactic(4608, 7168, 32, kH200Sms);
  EXPECT_EQ(t.token_tiles, 4);
  EXPECT_EQ(t.blocks, 72);
  EXPECT_EQ(t.ctas, t.blocks * t.split);
}

TEST(GemmRules, EnginePreferredOnlyWhereMeasuredAhead) {
  EXPECT_TRUE(choose_tactic(2112, 7168, 1, kH200Sms).engine_preferred);     // fused_qkv_a
  EXPECT_TRUE(choose_tactic(2112, 7168, 8, kH200Sms).engine_preferred);
  EXPECT_TRUE(choose_tactic(2112, 7168, 4, 66).engine_preferred);           // 33 blocks, 66 SMs
  EXPECT_FALSE(choose_tactic(2112, 7168, 4, 65).engine_preferred);
  EXPECT_FALSE(choose_tactic(4608, 7168, 4, kH200Sms).engine_preferred);    // TP8 gate_up: a tie
  EXPECT_FALSE(choose_tactic(2112, 7168, 9, kH200Sms).engine_preferred);    // two token tiles
  EXPECT_FALSE(choose_tactic(7168, 1536, 1, kH200Sms).engine_preferred);    // short K
  EXPECT_FALSE(choose_tactic(7168, 12288, 1, kH200Sms).engine_preferred);   // K > 8192
  EXPECT_FALSE(choose_tactic(20480, 7168, 1, kH200Sms).engine_preferred);   // 320 blocks
  EXPECT_FALSE(choose_tactic(163840, 7168, 1, kH200Sms).engine_preferred);
}

TEST(GemmRules, TacticIsLegalAndNoWorseThanNoSplit) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int64_t n = 16 * static_cast<int64_t>(1 + rng() % 2048);
    const int64_t k = 128 * static_cast<int64_t>(1 + rng() % 128);
    const int m = 1 + static_cast<int>(rng() % 32);
    const int sms = 1 + static_cast<int>(rng() % 132);
    if (!warp_eligible(n, k)) continue;
    const GemmTactic t = choose_tactic(n, k, m, sms);
    EXPECT_TRUE(t.split == 1 || t.split == 2 || t.split == 4 || t.split == 8);
    if (t.split > 1) EXPECT_GE(k / kWarpChunkK, 2 * int64_t{t.split}) << n << "x" << k;  // >= 2 chunks per rank
    EXPECT_EQ(t.ctas, (n + kWarpCtaRows - 1) / kWarpCtaRows * t.split);
    EXPECT_LE(t.predicted_us, tactic_with_split(n, k, m, sms, 1).predicted_us) << n << "x" << k;
  }
}

TEST(GemmRules, ForcedSplitMustBeLegal) {
  EXPECT_NO_THROW(tactic_with_split(7168, 1536, 4, kH200Sms, 4));                // 12 chunks, 3 per rank
  EXPECT_THROW(tactic_with_split(7168, 1536, 4, kH200Sms, 8), InvalidArgument);  // 1.5 chunks per rank
  EXPECT_THROW(tactic_with_split(7168, 7168, 4, kH200Sms, 3), InvalidArgument);
  EXPECT_THROW(tactic_with_split(7160, 7168, 4, kH200Sms, 1), InvalidArgument);  // not eligible
}

alignas(16) uint16_t host[64 * 1024];

TEST(GemmRules, OperandsTheEngineTakes) {
  const TensorView w = TensorView::bf16(host, 32, 256);
  EXPECT_TRUE(warp_weight_ok(w));
  EXPECT_FALSE(warp_weight_ok(TensorView::bf16(host + 1, 32, 256)));  // misaligned
  TensorView strided = w;
  strided.row_stride = 264;
  EXPECT_FALSE(warp_weight_ok(strided));
  EXPECT_FALSE(warp_weight_ok(TensorView::bf16(host, 24, 256)));  // N % 16
  EXPECT_FALSE(warp_weight_ok(TensorView::f32(host, 32, 256)));
  EXPECT_FALSE(warp_weight_ok(TensorView::bf16(nullptr, 32, 256)));

  EXPECT_TRUE(warp_activations_ok(TensorView::bf16(host, 1, 256)));
  EXPECT_TRUE(warp_activations_ok(TensorView::bf16(host, 32, 256)));
  EXPECT_FALSE(warp_activations_ok(TensorView::bf16(host, 33, 256)));  // M > 32
  EXPECT_FALSE(warp_activations_ok(TensorView::bf16(host + 4, 4, 256)));  // 8-byte aligned only
  TensorView xs = TensorView::bf16(host, 4, 256);
  xs.row_stride = 384;
  EXPECT_FALSE(warp_activations_ok(xs));
}

std::vector<uint16_t> bf16_of(std::initializer_list<float> v) {
  std::vector<uint16_t> out;
  for (float f : v) out.push_back(bf16::from_float(f));
  return out;
}

TEST(GemmRules, ReferenceGemmByHand) {
  const auto x = bf16_of({1, 2, 3, 4});              // [2, 2]
  const auto w = bf16_of({1, 0, 0.5f, -1, 2, 2});    // [3, 2]
  const std::vector<double> out = reference::gemm_bf16(x, w, 2, 3, 2);
  const std::vector<double> want = {1, -1.5, 6, 3, -2.5, 14};
  ASSERT_EQ(out.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(out[i], want[i]) << i;
}

TEST(GemmRules, ReferenceGemmKeepsSmallTermsFp32WouldLose) {
  // 2^24 + 1 - 2^24: FP32 accumulation gives 0; FP64 gives the exact 1.
  const auto x = bf16_of({16777216.0f, 1, -16777216.0f});
  const auto w = bf16_of({1, 1, 1});
  EXPECT_EQ(reference::gemm_bf16(x, w, 1, 1, 3)[0], 1.0);
  EXPECT_THROW(reference::gemm_bf16(x, w, 1, 2, 3), InvalidArgument);
}

TEST(GemmRules, RelativeError) {
  const std::vector<double> ref = {3, 4};
  const std::vector<double> a = {3, 4.5};
  EXPECT_DOUBLE_EQ(reference::relative_error(a, ref), 0.1);
  EXPECT_DOUBLE_EQ(reference::relative_error(ref, ref), 0.0);
  EXPECT_THROW(reference::relative_error(a, std::vector<double>{0, 0}), InvalidArgument);
}

}  // namespace
}  // namespace tpdecode
