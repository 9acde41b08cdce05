// DecodeGemm's host rules (seed 004 eligibility, the tactic rule, which operands
// the engine takes) and the FP64 reference GEMM the device tests trust.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "tpdecode/bf16.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/gemm_tactic.hpp"
#include "tpdecode/reference/gemm.hpp"

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

TEST(GemmRules, SharedMemoryLayout) {
  // Ring 8 x 4 warps x 4 KB, partials 2 x 8 tokens x 64 x 4 B, x slice 28 chunks x 8 tokens x 256 B.
  EXPECT_EQ(warp_smem_bytes(1, 8, 28), 131072 + 4096 + 57344);
  EXPECT_EQ(warp_smem_bytes(4, 4, 16), 65536 + 16384 + 131072);  // the largest eligible K at M = 32
  const ClusterResidency h200 = uniform_residency(kH200Sms);
  EXPECT_EQ(h200(1, 8, 1, 150 * 1024), 132);  // one CTA per SM
  EXPECT_EQ(h200(1, 8, 8, 150 * 1024), 16);
  EXPECT_EQ(h200(1, 4, 2, 100 * 1024), 132);  // two CTAs per SM, clusters of two
}

TEST(GemmRules, EveryEligibleShapeHasALaunchShape) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t n = 16 * static_cast<int64_t>(1 + rng() % 4096);
    const int64_t k = 128 * static_cast<int64_t>(1 + rng() % 128);
    const int m = 1 + static_cast<int>(rng() % 32);
    const int sms = 8 + static_cast<int>(rng() % 125);
    if (!warp_eligible(n, k)) continue;
    SCOPED_TRACE(testing::Message() << n << "x" << k << " M " << m << " SMs " << sms);
    const GemmTactic t = choose_tactic(n, k, m, uniform_residency(sms));
    ASSERT_TRUE(t.runnable());
    EXPECT_TRUE(t.split == 1 || t.split == 2 || t.split == 4 || t.split == 8);
    if (t.split > 1) EXPECT_GE(k / kWarpChunkK, 2 * int64_t{t.split});  // >= 2 chunks per rank
    EXPECT_TRUE(t.stages == 4 || t.stages == 6 || t.stages == 8);
    EXPECT_LE(t.smem_bytes, kWarpSmemLimit);
    EXPECT_EQ(t.smem_bytes, warp_smem_bytes(t.token_tiles, t.stages, t.chunks_per_rank));
    EXPECT_EQ(t.chunks_per_rank, (k / kWarpChunkK + t.split - 1) / t.split);
    EXPECT_EQ(t.blocks, (n + kWarpCtaRows - 1) / kWarpCtaRows);
    EXPECT_LE(t.clusters, t.blocks);
    EXPECT_LE(t.clusters, uniform_residency(sms)(t.token_tiles, t.stages, t.split, t.smem_bytes));
    EXPECT_EQ(t.rounds, (t.blocks + t.clusters - 1) / t.clusters);
    EXPECT_GT(t.predicted_us, 0);
  }
}

TEST(GemmRules, TacticOnReferenceShapes) {
  const ClusterResidency h200 = uniform_residency(kH200Sms);
  // fused_qkv_a: 33 blocks; a K split of 4 fills the SMs in one round.
  GemmTactic t = choose_tactic(2112, 7168, 1, h200);
  EXPECT_EQ(t.split, 4);
  EXPECT_EQ(t.clusters, 33);
  EXPECT_EQ(t.rounds, 1);
  EXPECT_EQ(t.stages, 8);
  // TP1 lm_head: K 7168 does not fit unsplit (x slice 112 KB); split 2, 66 clusters.
  t = choose_tactic(163840, 7168, 1, h200);
  EXPECT_EQ(t.split, 2);
  EXPECT_EQ(t.clusters, 66);
  EXPECT_EQ(t.rounds, 39);
  // M = 32: a 4-tile x slice of K 7168 needs split >= 8 at 8 stages, or a shallower ring.
  t = choose_tactic(4608, 7168, 32, h200);
  EXPECT_EQ(t.token_tiles, 4);
  EXPECT_EQ(t.blocks, 72);
  EXPECT_LE(t.smem_bytes, kWarpSmemLimit);
  // The largest eligible K at M = 32 fits only split 8 with a 4-stage ring.
  t = choose_tactic(32768, 16384, 32, h200);
  EXPECT_EQ(t.split, 8);
  EXPECT_EQ(t.stages, 4);
}

TEST(GemmRules, FewerResidentClustersChangeTheSplit) {
  // A GPU whose clusters of 4 pack only 30 at once: 33 blocks would take two rounds.
  const ClusterResidency uneven = [](int tiles, int stages, int split, int smem) {
    return split == 4 ? 30 : uniform_residency(kH200Sms)(tiles, stages, split, smem);
  };
  const GemmTactic t = choose_tactic(2112, 7168, 1, uneven);
  EXPECT_NE(t.split, 4);
  EXPECT_EQ(t.rounds, 1);
  const ClusterResidency none = [](int, int, int, int) { return 0; };
  const GemmTactic n = choose_tactic(2112, 7168, 1, none);
  EXPECT_FALSE(n.runnable());
  EXPECT_FALSE(n.engine_preferred);
}

TEST(GemmRules, ForcedSplitMustFit) {
  const ClusterResidency h200 = uniform_residency(kH200Sms);
  EXPECT_NO_THROW(tactic_with_split(7168, 1536, 4, h200, 4));                 // 12 chunks, 3 per rank
  EXPECT_THROW(tactic_with_split(7168, 1536, 4, h200, 8), InvalidArgument);   // 1.5 chunks per rank
  EXPECT_THROW(tactic_with_split(7168, 7168, 4, h200, 3), InvalidArgument);
  EXPECT_THROW(tactic_with_split(7160, 7168, 4, h200, 1), InvalidArgument);   // not eligible
  EXPECT_THROW(tactic_with_split(2112, 7168, 32, h200, 1), InvalidArgument);  // x slice 448 KB
  EXPECT_EQ(tactic_with_split(2112, 7168, 1, h200, 4, 6).stages, 6);
  EXPECT_THROW(tactic_with_split(2112, 7168, 1, h200, 4, 5), InvalidArgument);
  EXPECT_THROW(tactic_with_split(32768, 16384, 32, h200, 8, 8), InvalidArgument);  // ring too deep to fit
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
