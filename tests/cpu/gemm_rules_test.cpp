// DecodeGemm's host rules (the engines' eligibility, the tactic rule, which operands
// the engines take, the M buckets, the candidates the tuner times) and the FP64
// reference GEMM the device tests trust.
#include <algorithm>
#include <array>
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/bf16.hpp"
#include "gemm/gemm_tactic.hpp"
#include "gemm/warp_splitk_launch.hpp"
#include "reference/gemm.hpp"
#include "gemm/wgmma_plan.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

constexpr int kH200Sms = 132;

TEST(GemmRules, WarpEligibility) {
  EXPECT_TRUE(warp_eligible(2112, 7168));     // fused_qkv_a: 56 chunks of 128
  EXPECT_TRUE(warp_eligible(16, 128));
  EXPECT_TRUE(warp_eligible(16, 8320));       // 65 chunks, K % 256 != 0
  EXPECT_TRUE(warp_eligible(7168, 18432));    // TP1 down: 144 chunks
  EXPECT_TRUE(warp_eligible(896, 35840));     // context projection: 280 chunks
  EXPECT_TRUE(warp_eligible(16, int64_t{1} << 36));      // N * K = 2^40
  EXPECT_FALSE(warp_eligible(32, int64_t{1} << 36));     // N * K > 2^40
  EXPECT_FALSE(warp_eligible(2120, 7168));    // N % 16 != 0
  EXPECT_FALSE(warp_eligible(2112, 7200));    // K % 128 != 0
  EXPECT_FALSE(warp_eligible(0, 128));
  EXPECT_FALSE(warp_eligible(16, 0));
  EXPECT_FALSE(warp_eligible(-16, 128));
}

TEST(GemmRules, TokenTilesCoverRows) {
  EXPECT_EQ(warp_token_tiles(1), 1);
  EXPECT_EQ(warp_token_tiles(8), 1);
  EXPECT_EQ(warp_token_tiles(9), 2);
  EXPECT_EQ(warp_token_tiles(16), 2);
  EXPECT_EQ(warp_token_tiles(17), 4);
  EXPECT_EQ(warp_token_tiles(32), 4);
  EXPECT_EQ(warp_token_tiles(33), 8);
  EXPECT_EQ(warp_token_tiles(64), 8);
  EXPECT_THROW(warp_token_tiles(0), InvalidArgument);
  EXPECT_THROW(warp_token_tiles(65), InvalidArgument);
}

TEST(GemmRules, SeveralCtasFitOnAnSm) {
  for (int tiles : {1, 2, 4}) {
    EXPECT_LE(warp_smem_bytes(tiles), 227 * 1024);
    EXPECT_GE(warp_ctas_per_sm(tiles), 2) << tiles;
  }
  // 64 rows: one CTA per SM, outside the rule's model (its residency tables).
  EXPECT_LE(warp_smem_bytes(8), 227 * 1024);
  EXPECT_EQ(warp_ctas_per_sm(8), 1);
  EXPECT_THROW(choose_tactic(2112, 7168, kWarpCandidateMaxRows + 1, kH200Sms), InvalidArgument);
  EXPECT_EQ(rule_decision(2112, 7168, kWarpCandidateMaxRows + 1, kH200Sms, {true}).path, GemmPath::kCublas);
  // The narrow CTA: the same W ring, an x ring per warp; two per SM at 8 rows (room
  // for the next kernel's CTA beside each), one at 16.
  EXPECT_EQ(warp_smem_bytes(1, 1), 4 * 4 * 4096 + 4 * 4 * 8 * 256 + 4 * 8 * 16 * 4);
  // The tensor-map form: 1 KB to align, the same rings, 16 mbarriers, the partials.
  EXPECT_EQ(warp_smem_bytes(1, 1, true), 1024 + 4 * 4 * 4096 + 4 * 4 * 8 * 256 + 16 * 8 + 4 * 8 * 16 * 4);
  EXPECT_EQ(warp_ctas_per_sm(1, 1, true), 2);
  EXPECT_EQ(warp_ctas_per_sm(2, 1, true), 1);
  EXPECT_EQ(warp_ctas_per_sm(1, 1), 2);
  EXPECT_EQ(warp_ctas_per_sm(2, 1), 1);
  // The two-tile one: two x rings (one per pair of warps), partials of 32 rows.
  EXPECT_EQ(warp_smem_bytes(1, 2), 4 * 4 * 4096 + 2 * 4 * 8 * 256 + 2 * 8 * 32 * 4);
  EXPECT_EQ(warp_ctas_per_sm(1, 2), 2);
  EXPECT_EQ(warp_ctas_per_sm(2, 2), 2);
  EXPECT_EQ(warp_smem_bytes(1), warp_smem_bytes(1, kWarpWarps));
}

// The narrow CTAs' rotated K walk visits each of a group's chunks once, starting at
// the block's rotation; block 0 (and any multiple of the count) walks in order.
TEST(GemmRules, NarrowWalkIsARotation) {
  for (int count : {1, 2, 7, 14, 56})
    for (int64_t block : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{13}, int64_t{65534}}) {
      std::vector<int> seen(static_cast<std::size_t>(count), 0);
      for (int c = 0; c < count; ++c) {
        const int r = rotated_chunk(c, walk_rotation(block, count), count);
        ASSERT_GE(r, 0);
        ASSERT_LT(r, count);
        ++seen[static_cast<std::size_t>(r)];
      }
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), count) << count << " chunks, block " << block;
      EXPECT_EQ(rotated_chunk(0, walk_rotation(block, count), count), static_cast<int>(block % count));
    }
  EXPECT_EQ(walk_rotation(14, 7), 0);  // a multiple of the count: in order
  EXPECT_EQ(walk_rotation(5, 0), 0);   // no chunks
}

TEST(GemmRules, NarrowCtasUpTo16Rows) {
  EXPECT_TRUE(warp_row_tiles_ok(kWarpWarps, 64));
  EXPECT_TRUE(warp_row_tiles_ok(1, 1));
  EXPECT_TRUE(warp_row_tiles_ok(1, kWarpNarrowMaxRows));
  EXPECT_FALSE(warp_row_tiles_ok(1, kWarpNarrowMaxRows + 1));
  EXPECT_TRUE(warp_row_tiles_ok(2, kWarpNarrowMaxRows));
  EXPECT_FALSE(warp_row_tiles_ok(2, kWarpNarrowMaxRows + 1));
  EXPECT_FALSE(warp_row_tiles_ok(3, 8));
  EXPECT_FALSE(warp_row_tiles_ok(0, 8));
  const GemmTactic t = warp_launch_tactic(2112, 7168, 8, 1, 1);
  EXPECT_EQ(t.blocks, 132);
  EXPECT_EQ(t.ctas, 132);
  EXPECT_EQ(t.describe(), "132 blocks of 16 rows x split 1, 1 token tile");
  EXPECT_EQ(warp_launch_tactic(2112, 7168, 8, 2).blocks, 33);
  EXPECT_EQ(warp_launch_tactic(2112, 7168, 8, 2, 2).describe(), "66 blocks of 32 rows x split 2, 1 token tile");
  EXPECT_EQ(warp_launch_tactic(80, 1024, 8, 1, 2).blocks, 3);  // the last block half past N
  EXPECT_THROW(warp_launch_tactic(2112, 7168, 17, 1, 1), InvalidArgument);
  EXPECT_EQ(warp_launch_tactic(2112, 7168, 8, 1, 1, true).describe(),
            "132 blocks of 16 rows x split 1, 1 token tile, tensor maps");
  EXPECT_THROW(warp_launch_tactic(2112, 7168, 8, 1, 2, true), InvalidArgument);  // one-tile CTAs only
  // A narrow decision runs more rows as launches of 16; the wide one in one launch.
  EXPECT_EQ(warp_launch_rows(1, 8), 8);
  EXPECT_EQ(warp_launch_rows(1, 16), 16);
  EXPECT_EQ(warp_launch_rows(1, 17), 16);
  EXPECT_EQ(warp_launch_rows(1, 64), 16);
  EXPECT_EQ(warp_launch_rows(2, 33), 16);
  EXPECT_EQ(warp_launch_rows(kWarpWarps, 64), 64);
  const GemmEngines warp{true};
  EXPECT_TRUE(engine_decision_legal(warp_decision(3, 1), 2112, 7168, 16, kH200Sms, warp));
  EXPECT_TRUE(engine_decision_legal(warp_decision(3, 1), 2112, 7168, 17, kH200Sms, warp));  // launches of 16
  EXPECT_TRUE(engine_decision_legal(warp_decision(3, 1), 2112, 7168, 64, kH200Sms, warp));
  EXPECT_TRUE(engine_decision_legal(warp_decision(3, 2), 2112, 7168, 64, kH200Sms, warp));
  EXPECT_FALSE(engine_decision_legal(warp_decision(3, 3), 2112, 7168, 8, kH200Sms, warp));
  EXPECT_FALSE(engine_decision_legal(warp_decision(3, 0), 2112, 7168, 8, kH200Sms, warp));
  // The grid's y limit: 65535 blocks of 16 rows.
  EXPECT_TRUE(engine_decision_legal(warp_decision(1, 1), 16 * 65535, 128, 8, kH200Sms, warp));
  EXPECT_FALSE(engine_decision_legal(warp_decision(1, 1), 16 * 65536, 128, 8, kH200Sms, warp));
  EXPECT_EQ(describe(warp_decision(2, 1)), "warp split 2, 16-row CTAs");
  EXPECT_EQ(describe(warp_decision(2, 2)), "warp split 2, 32-row CTAs");
  EXPECT_EQ(describe(warp_decision(2)), "warp split 2");
  EXPECT_EQ(describe(warp_decision(2, 1, true)), "warp split 2, 16-row CTAs, tensor maps");
  EXPECT_FALSE(warp_decision(2, 1).same_path(warp_decision(2)));
  EXPECT_FALSE(warp_decision(2, 1).same_path(warp_decision(2, 1, true)));
  // The tensor-map form: the one-tile CTA's only, where the weight has a map.
  EXPECT_TRUE(warp_tensor_map(warp_decision(3, 1, true)));
  EXPECT_FALSE(warp_tensor_map(warp_decision(3, 1)));
  EXPECT_TRUE(engine_decision_legal(warp_decision(3, 1, true), 2112, 7168, 8, kH200Sms, warp));
  EXPECT_TRUE(engine_decision_legal(warp_decision(3, 1, true), 2112, 7168, 40, kH200Sms, warp));  // launches of 16
  GemmDecision two_tiles = warp_decision(3, 2);
  two_tiles.stages = kNarrowTmaStages;
  EXPECT_FALSE(engine_decision_legal(two_tiles, 2112, 7168, 8, kH200Sms, warp));
  GemmDecision odd_ring = warp_decision(3, 1, true);
  odd_ring.stages = 3;
  EXPECT_FALSE(engine_decision_legal(odd_ring, 2112, 7168, 8, kH200Sms, warp));
  EXPECT_FALSE(warp_tensor_map_ok(16, int64_t{1} << 31));  // K past a tensor map's coordinates
}

TEST(GemmRules, NarrowCtaWarpsTakeEveryChunkOnce) {
  for (int groups : {1, 4})
    for (int chunks = 0; chunks <= 70; ++chunks) {
      std::vector<int> seen(static_cast<std::size_t>(chunks), 0);
      for (int g = 0; g < groups; ++g)
        for (int c = 0; c < warp_group_chunks(chunks, g, groups); ++c) {
          const int chunk = g + groups * c;
          ASSERT_LT(chunk, chunks) << groups << " groups, " << chunks << " chunks";
          ++seen[static_cast<std::size_t>(chunk)];
        }
      for (int v : seen) EXPECT_EQ(v, 1) << groups << " groups, " << chunks << " chunks";
    }
}

TEST(GemmRules, TacticOnReferenceShapes) {
  // The splits measured fastest on an H200 (docs/history/performance-2026-11.md,
  // "Every split 1–8"), M <= 8.
  EXPECT_EQ(choose_tactic(2112, 7168, 1, kH200Sms).split, 8);   // 33 blocks: K split fills the SMs
  EXPECT_EQ(choose_tactic(2304, 1536, 1, kH200Sms).split, 6);   // 36 blocks, 12 chunks
  EXPECT_EQ(choose_tactic(4608, 7168, 8, kH200Sms).split, 4);   // 72 blocks: one round of 92 clusters
  // 112 blocks: one round of 124 clusters of 3; 92 of 4 need two.
  EXPECT_EQ(choose_tactic(7168, 1536, 1, kH200Sms).split, 3);
  EXPECT_EQ(choose_tactic(7168, 2304, 1, kH200Sms).split, 3);
  EXPECT_EQ(choose_tactic(7168, 12288, 1, kH200Sms).split, 3);
  EXPECT_EQ(choose_tactic(18432, 1536, 1, kH200Sms).split, 1);  // 288 blocks, short K
  EXPECT_EQ(choose_tactic(36864, 7168, 1, kH200Sms).split, 2);  // 576 blocks: 2.9 rounds of 198
  const GemmTactic t = choose_tactic(4608, 7168, 32, kH200Sms);
  EXPECT_EQ(t.token_tiles, 4);
  EXPECT_EQ(t.blocks, 72);
  EXPECT_EQ(t.ctas, t.blocks * t.split);
}

TEST(GemmRules, EnginePreferredWhereTheModelBeatsCublas) {
  EXPECT_TRUE(choose_tactic(2112, 7168, 1, kH200Sms).engine_preferred);     // fused_qkv_a
  EXPECT_TRUE(choose_tactic(2112, 7168, 8, kH200Sms).engine_preferred);
  EXPECT_TRUE(choose_tactic(4608, 7168, 4, kH200Sms).engine_preferred);     // TP 8 gate_up
  EXPECT_TRUE(choose_tactic(7168, 12288, 1, kH200Sms).engine_preferred);    // TP 1 o_proj
  EXPECT_TRUE(choose_tactic(36864, 7168, 1, kH200Sms).engine_preferred);    // TP 1 gate_up
  EXPECT_TRUE(choose_tactic(1152, 1536, 16, kH200Sms).engine_preferred);    // a small weight: cuBLAS's fixed cost
  EXPECT_FALSE(choose_tactic(896, 35840, 1, kH200Sms).engine_preferred);    // 14 blocks: 112 CTAs at most
  EXPECT_FALSE(choose_tactic(9216, 1536, 16, kH200Sms).engine_preferred);   // two token tiles
  EXPECT_FALSE(choose_tactic(20480, 7168, 16, kH200Sms).engine_preferred);
  EXPECT_FALSE(choose_tactic(2112, 7168, 17, kH200Sms).engine_preferred);   // four token tiles: cuBLAS
  // Fewer SMs: fewer resident clusters, the same weight takes longer than cuBLAS's model.
  EXPECT_FALSE(choose_tactic(2112, 7168, 1, 66).engine_preferred);
}

// The rule against measurements: `tpdecode bench gemm` on an H200 (read ceiling
// 4.44 TB/s; docs/history/performance-2026-11.md, "The static rule, refit"), every
// warp split forced (0: not legal) and cuBLAS's default, µs.
TEST(GemmRules, RuleNearTheMeasuredBest) {
  struct Measured {
    int64_t n, k;
    int m;
    std::array<double, 8> warp;
    double cublas;
  };
  const std::vector<Measured> rows = {
      {2112, 7168, 1, {34.88, 18.83, 14.46, 12.09, 10.87, 11.34, 9.98, 9.72}, 12.34},
      {2112, 7168, 8, {33.80, 18.41, 14.66, 12.57, 11.19, 11.29, 10.27, 10.00}, 13.03},
      {2304, 1536, 1, {8.07, 5.33, 4.64, 3.89, 4.26, 3.78, 0, 0}, 5.44},
      {7168, 1536, 1, {9.56, 7.99, 7.81, 10.50, 10.43, 9.55, 0, 0}, 8.35},
      {4608, 7168, 1, {35.20, 22.38, 22.99, 18.53, 23.50, 22.86, 21.19, 20.51}, 21.45},
      {7168, 2304, 1, {13.31, 10.87, 10.34, 13.42, 13.30, 12.84, 15.99, 15.60}, 11.03},
      {20480, 7168, 1, {75.67, 77.63, 73.85, 74.20, 74.57, 73.18, 74.54, 73.63}, 77.60},
      {896, 35840, 1, {169.39, 85.96, 58.38, 43.83, 36.92, 30.98, 28.52, 25.00}, 20.50},
      {9216, 7168, 1, {42.45, 37.23, 41.08, 36.93, 38.03, 37.67, 37.35, 37.08}, 38.94},
      {7168, 4608, 1, {25.04, 21.97, 17.80, 22.74, 20.88, 19.86, 22.16, 22.49}, 21.68},
      {40960, 7168, 8, {154.17, 146.08, 142.58, 141.51, 142.53, 140.59, 143.96, 142.25}, 141.43},
      {9216, 1536, 1, {10.49, 9.04, 11.97, 11.79, 13.47, 13.08, 0, 0}, 9.76},
      {7168, 6144, 1, {32.98, 29.00, 22.63, 29.08, 26.28, 24.75, 27.55, 26.78}, 26.24},
      {18432, 7168, 1, {71.36, 72.46, 69.28, 66.16, 67.17, 67.22, 67.69, 67.05}, 69.76},
      {7168, 9216, 1, {48.24, 43.51, 32.92, 40.20, 36.77, 35.14, 38.58, 38.02}, 36.56},
      {18432, 1536, 1, {15.84, 18.57, 19.55, 19.78, 23.03, 23.74, 0, 0}, 17.14},
      {7168, 12288, 1, {63.99, 57.68, 43.20, 51.84, 47.41, 44.89, 49.63, 48.25}, 47.58},
      {36864, 7168, 1, {140.64, 123.62, 127.58, 125.09, 126.52, 125.18, 126.59, 125.76}, 134.97},
      {7168, 18432, 1, {93.33, 82.04, 63.82, 76.29, 68.66, 66.01, 72.65, 70.13}, 69.97},
      {163840, 7168, 1, {533.88, 532.25, 528.21, 525.33, 529.72, 580.58, 594.50, 540.78}, 542.33},
      {1152, 1536, 1, {7.96, 5.12, 4.13, 3.49, 3.58, 3.10, 0, 0}, 5.40},
      {6288, 7168, 1, {35.46, 23.73, 25.18, 30.24, 28.24, 26.45, 27.84, 27.73}, 26.83},
      {10240, 7168, 8, {44.63, 40.86, 43.89, 38.79, 42.70, 40.71, 42.33, 41.31}, 36.40},
      {12448, 7168, 1, {51.22, 42.71, 48.13, 47.77, 48.10, 46.59, 47.89, 47.64}, 49.38},
      {16896, 7168, 1, {71.14, 65.70, 63.78, 61.23, 63.62, 61.15, 63.18, 62.39}, 59.64},
  };
  double chosen_total = 0, best_total = 0;
  for (const Measured& r : rows) {
    const GemmDecision d = rule_decision(r.n, r.k, r.m, kH200Sms, {true});
    const double chosen = d.path == GemmPath::kWarpSplitK ? r.warp[d.split - 1] : r.cublas;
    double best = r.cublas;
    for (double us : r.warp)
      if (us > 0) best = std::min(best, us);
    ASSERT_GT(chosen, 0) << r.n << "x" << r.k << ": " << describe(d) << " is not legal there";
    EXPECT_LE(chosen, 1.13 * best) << r.n << "x" << r.k << " M " << r.m << ": " << describe(d);
    chosen_total += chosen;
    best_total += best;
  }
  EXPECT_LE(chosen_total, 1.02 * best_total);  // cuBLAS on most of these shapes: 1.057
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
    EXPECT_TRUE(warp_split_ok(k, t.split)) << n << "x" << k << " split " << t.split;  // >= 2 chunks per rank
    EXPECT_EQ(t.ctas, (n + kWarpCtaRows - 1) / kWarpCtaRows * t.split);
    EXPECT_LE(t.predicted_us, tactic_with_split(n, k, m, sms, 1).predicted_us) << n << "x" << k;
    const GemmTactic shared = choose_tactic(n, k, m, sms, true);
    EXPECT_TRUE(warp_split_for_shared_gpu(shared.split) && warp_split_ok(k, shared.split)) << shared.split;
    EXPECT_LE(t.predicted_us, shared.predicted_us / 0.98);  // a larger split must win by 2 %
  }
}

TEST(GemmRules, ForcedSplitMustBeLegal) {
  EXPECT_NO_THROW(tactic_with_split(7168, 1536, 4, kH200Sms, 4));                // 12 chunks, 3 per rank
  EXPECT_THROW(tactic_with_split(7168, 1536, 4, kH200Sms, 8), InvalidArgument);  // 1.5 chunks per rank
  EXPECT_NO_THROW(tactic_with_split(7168, 7168, 4, kH200Sms, 3));                // any cluster size up to 8
  EXPECT_THROW(tactic_with_split(7168, 7168, 4, kH200Sms, 9), InvalidArgument);
  EXPECT_THROW(tactic_with_split(7168, 7168, 4, kH200Sms, 0), InvalidArgument);
  EXPECT_THROW(tactic_with_split(7168, 1536, 4, kH200Sms, 7), InvalidArgument);  // 12 chunks: < 2 per rank
  EXPECT_NO_THROW(tactic_with_split(7168, 1536, 4, kH200Sms, 6));
  EXPECT_THROW(tactic_with_split(7160, 7168, 4, kH200Sms, 1), InvalidArgument);  // not eligible
}

TEST(GemmRules, BucketsPartitionTheRowsWithinTokenTiles) {
  int expected = 0;
  for (int m = 1; m <= kGemmMaxRows; ++m) {
    const int b = gemm_m_bucket(m);
    if (m > 1 && b != gemm_m_bucket(m - 1)) ++expected;
    EXPECT_EQ(b, expected) << m;
    EXPECT_LE(gemm_bucket_min(b), m);
    EXPECT_GE(gemm_bucket_max(b), m);
    EXPECT_EQ(wgmma::token_tile(gemm_bucket_min(b)), wgmma::token_tile(gemm_bucket_max(b))) << "bucket " << b;
    EXPECT_EQ(warp_token_tiles(gemm_bucket_min(b)), warp_token_tiles(gemm_bucket_max(b))) << "bucket " << b;
  }
  EXPECT_EQ(expected, kGemmBuckets - 1);
  EXPECT_EQ(gemm_m_bucket(7), gemm_m_bucket(8));    // 5-8
  EXPECT_NE(gemm_m_bucket(13), gemm_m_bucket(12));  // 13-16 vs 9-12
  EXPECT_NE(gemm_m_bucket(28), gemm_m_bucket(29));  // a 28-row call is timed at 28, not 32
  for (int m : {8, 28, 56}) EXPECT_EQ(gemm_bucket_max(gemm_m_bucket(m)), m);  // the drafter's R x 7 rows
  // No bucket straddles the rows where the warp engine is a candidate.
  EXPECT_EQ(gemm_bucket_max(gemm_m_bucket(kWarpCandidateMaxRows)), kWarpCandidateMaxRows);
  EXPECT_THROW(gemm_m_bucket(0), InvalidArgument);
  EXPECT_THROW(gemm_m_bucket(kGemmMaxRows + 1), InvalidArgument);
  EXPECT_THROW(gemm_bucket_max(kGemmBuckets), InvalidArgument);
}

TEST(GemmRules, CandidatesAreLegalAndEndWithCublas) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = 16 * static_cast<int64_t>(1 + rng() % 4096);
    const int64_t k = 128 * static_cast<int64_t>(1 + rng() % 300);
    const int m = 1 + static_cast<int>(rng() % kGemmMaxRows);
    const GemmEngines engines{warp_eligible(n, k)};
    const std::vector<GemmDecision> c = engine_candidates(n, k, m, engines);
    ASSERT_FALSE(c.empty());
    EXPECT_EQ(c.back().path, GemmPath::kCublas);
    int warps = 0;
    for (const GemmDecision& d : c) {
      EXPECT_TRUE(engine_decision_legal(d, n, k, m, kH200Sms, engines)) << describe(d) << " " << n << "x" << k;
      warps += d.path == GemmPath::kWarpSplitK;
    }
    // Every split up to 8 that leaves each cluster rank two chunks, odd ones too, for
    // each CTA shape (the two narrow ones up to 16 rows, the one-tile CTA in both forms).
    const int64_t chunks = k / kWarpChunkK;
    const int splits = engines.warp && m <= kWarpCandidateMaxRows
                           ? static_cast<int>(std::min<int64_t>(kWarpMaxSplit, std::max<int64_t>(1, chunks / 2)))
                           : 0;
    EXPECT_EQ(warps, splits * (m <= kWarpNarrowMaxRows ? 4 : 1)) << n << "x" << k << " M " << m;
    EXPECT_TRUE(engine_decision_legal(rule_decision(n, k, m, kH200Sms, engines), n, k, m, kH200Sms, engines));
  }
  // No engine: cuBLAS alone.
  const std::vector<GemmDecision> none = engine_candidates(2112, 7168, 4, GemmEngines{});
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0].path, GemmPath::kCublas);
  GemmDecision bad = warp_decision(9);
  EXPECT_FALSE(engine_decision_legal(bad, 2112, 7168, 4, kH200Sms, {true}));
  bad.split = 2;
  EXPECT_FALSE(engine_decision_legal(bad, 2112, 7168, 4, kH200Sms, {false}));  // no engine takes the weight
  EXPECT_FALSE(engine_decision_legal(bad, 2112, 256, 4, kH200Sms, {true}));   // two chunks: split 1 only
  EXPECT_TRUE(engine_decision_legal(bad, 2112, 7168, 64, kH200Sms, {true}));  // runs 64 rows where forced
  EXPECT_FALSE(engine_decision_legal(bad, 2112, 7168, 65, kH200Sms, {true}));
}

TEST(GemmRules, RuleKeepsTheMeasuredWarpCases) {
  const GemmEngines both{true};
  EXPECT_EQ(rule_decision(2112, 7168, 1, kH200Sms, both).path, GemmPath::kWarpSplitK);
  EXPECT_EQ(rule_decision(2112, 7168, 1, kH200Sms, both).split, 8);
  EXPECT_EQ(rule_decision(4608, 7168, 1, kH200Sms, both).split, 4);
  EXPECT_EQ(rule_decision(7168, 2304, 1, kH200Sms, both).split, 3);
  EXPECT_EQ(rule_decision(7168, 2304, 1, kH200Sms, both, true).path, GemmPath::kWarpSplitK);
  EXPECT_TRUE(warp_split_for_shared_gpu(rule_decision(7168, 2304, 1, kH200Sms, both, true).split));
  EXPECT_EQ(rule_decision(896, 35840, 1, kH200Sms, both).path, GemmPath::kCublas);
  EXPECT_EQ(rule_decision(2112, 7168, 1, kH200Sms, {false}).path, GemmPath::kCublas);
  EXPECT_EQ(rule_decision(2112, 7168, 1, kH200Sms, both).source, GemmSource::kRule);
}

TEST(GemmRules, DecisionRecordIsSmallAndTriviallyCopyable) {
  static_assert(std::is_trivially_copyable_v<GemmDecision>);
  static_assert(sizeof(GemmDecision) <= 128);
  GemmDecision a, b;
  a.path = b.path = GemmPath::kCublasLt;
  a.lt_algo[3] = 7;
  EXPECT_FALSE(a.same_path(b));
  b.lt_algo[3] = 7;
  b.measured_us = 3;
  b.source = GemmSource::kCache;
  EXPECT_TRUE(a.same_path(b));
  EXPECT_EQ(describe(a), describe(b));
  EXPECT_EQ(std::string(gemm_path_name(GemmPath::kWarpSplitK)), "warp");
  EXPECT_EQ(std::string(gemm_path_name(GemmPath::kCublasLt)), "cublaslt");
  EXPECT_EQ(std::string(gemm_path_name(GemmPath::kWgmma)), "wgmma");
  EXPECT_EQ(std::string(gemm_path_name(GemmPath::kWgmmaWide)), "wgmma-wide");
  // Every field of a wgmma launch shape tells two decisions apart.
  const GemmDecision w = wgmma_decision(4, 2, 6, 33);
  EXPECT_TRUE(w.same_path(wgmma_decision(4, 2, 6, 33)));
  EXPECT_FALSE(w.same_path(wgmma_decision(3, 2, 6, 33)));
  EXPECT_FALSE(w.same_path(wgmma_decision(4, 1, 6, 33)));
  EXPECT_FALSE(w.same_path(wgmma_decision(4, 2, 7, 33)));
  EXPECT_FALSE(w.same_path(wgmma_decision(4, 2, 6, 0)));
  EXPECT_EQ(describe(w), "wgmma split 4 x 128 rows, 6 stages, 33 clusters");
}

TEST(GemmRules, WgmmaEligibility) {
  EXPECT_TRUE(wgmma_eligible(2112, 7168));
  EXPECT_TRUE(wgmma_eligible(896, 35840));
  EXPECT_TRUE(wgmma_eligible(1000, 640));    // any N
  EXPECT_TRUE(wgmma_eligible(2112, 7232));   // K % 64 (the warp engine needs K % 128)
  EXPECT_FALSE(warp_eligible(2112, 7232));
  EXPECT_FALSE(wgmma_eligible(2112, 7200));  // K % 64
  EXPECT_FALSE(wgmma_eligible(0, 128));
  EXPECT_FALSE(wgmma_eligible(int64_t{1} << 31, 64));  // beyond tensor-map coordinates
  EXPECT_FALSE(wgmma_eligible(int64_t{1} << 30, int64_t{1} << 11));  // N * K > 2^40
  EXPECT_TRUE(wgmma_split_ok(1024, 8));   // 16 chunks: two per CTA
  EXPECT_FALSE(wgmma_split_ok(1024, 9));
  EXPECT_FALSE(wgmma_split_ok(896, 8));   // 14 chunks
  EXPECT_TRUE(wgmma_split_ok(64, 1));
  EXPECT_FALSE(wgmma_split_ok(64, 0));
}

// Every launch shape of the ring fits its budget, with the 128-byte swizzle's
// alignment; the half-SM ring leaves room for a second CTA on the SM.
TEST(GemmRules, WgmmaLayoutsFitAndAlign) {
  int built = 0;
  for (int sub : {1, 2, 4})
    for (int tokens : {8, 16, 32, 64}) {
      if (!wgmma::shape_built(sub, tokens)) continue;
      ++built;
      for (int budget : {kWgmmaHalfBudget, kWgmmaFullBudget}) {
        const int stages = wgmma::stages_within(sub, tokens, budget);
        SCOPED_TRACE(testing::Message() << sub << " sub-tiles, " << tokens << " tokens, budget " << budget);
        if (stages == 0) {  // only 4 sub-tiles miss the half-SM ring
          EXPECT_TRUE(sub == 4 && budget == kWgmmaHalfBudget);
          continue;
        }
        ASSERT_GE(stages, wgmma::kMinStages);
        ASSERT_LE(stages, wgmma::kMaxStages);
        const wgmma::Layout l = wgmma::layout(sub, tokens, stages);
        EXPECT_LE(l.smem_bytes, budget);
        EXPECT_GT(wgmma::layout(sub, tokens, stages + 1).smem_bytes, stages < wgmma::kMaxStages ? budget : 0);
        EXPECT_EQ(l.stage_bytes % wgmma::kAlign, 0);
        EXPECT_EQ(l.w_bytes % wgmma::kAlign, 0);  // the activation tile starts 1024-aligned too
        EXPECT_EQ(l.partials_offset, stages * l.stage_bytes);
        EXPECT_EQ(l.barriers_offset % 8, 0);
        EXPECT_EQ(l.barriers_offset, l.partials_offset + 2 * l.partial_bytes);
        EXPECT_GE(l.partial_stride, sub * wgmma::kTileRows);
        if (budget == kWgmmaHalfBudget) EXPECT_LE(2 * (l.smem_bytes + kSmemReservedPerCta), kSmemPerSm);
        // Accumulators: 4 chains of sub-tiles x tokens / 2 registers.
        EXPECT_LE(4 * sub * tokens / 2, 128);
      }
    }
  EXPECT_EQ(built, 9);
  EXPECT_EQ(wgmma::stages_within(1, 8, 4096), 0);  // not even the shallowest ring
}

// A random shape the wgmma engine takes (K a multiple of 64, any N up to 40000), a
// row count and the engines that take it.
struct WgmmaCase {
  int64_t n, k;
  int m;
  GemmEngines engines;
};
WgmmaCase random_wgmma_case(std::mt19937_64& rng) {
  const int64_t n = 1 + static_cast<int64_t>(rng() % 40000);
  const int64_t k = 64 * static_cast<int64_t>(1 + rng() % 400);
  const int m = 1 + static_cast<int>(rng() % kGemmMaxRows);
  return {n, k, m, {warp_eligible(n, k), wgmma_eligible(n, k)}};
}

TEST(GemmRules, WgmmaCandidatesAreLegal) {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 300; ++trial) {
    const auto [n, k, m, engines] = random_wgmma_case(rng);
    SCOPED_TRACE(testing::Message() << n << "x" << k << " M " << m);
    const std::vector<GemmDecision> c = engine_candidates(n, k, m, engines);
    int wgmmas = 0;
    std::set<std::tuple<int, int, int>> seen;
    for (const GemmDecision& d : c) {
      EXPECT_TRUE(engine_decision_legal(d, n, k, m, kH200Sms, engines)) << describe(d);
      if (m > kWarpCandidateMaxRows) EXPECT_NE(d.path, GemmPath::kWarpSplitK);
      if (d.path != GemmPath::kWgmma) continue;
      ++wgmmas;
      EXPECT_EQ(d.clusters, 0);
      EXPECT_TRUE(seen.insert({d.split, d.sub_tiles, d.stages}).second) << "a tactic twice: " << describe(d);
    }
    // Splits 1 .. min(8, chunks / 2) at every built sub-tile count and budget whose
    // ring holds the fewest stages.
    const int splits = static_cast<int>(std::min<int64_t>(8, std::max<int64_t>(1, k / 64 / 2)));
    const int tokens = wgmma::token_tile(m);
    const int rings = tokens <= 16 ? 5 : tokens == 32 ? 4 : 2;  // 4 sub-tiles: the full budget only
    EXPECT_EQ(wgmmas, splits * rings);
  }
  GemmDecision bad = wgmma_decision(2, 4, 5);
  EXPECT_FALSE(engine_decision_legal(bad, 2112, 7168, 40, kH200Sms, {true, true}));  // 4 sub-tiles: 16 tokens at most
  EXPECT_TRUE(engine_decision_legal(bad, 2112, 7168, 16, kH200Sms, {true, true}));
  EXPECT_FALSE(engine_decision_legal(bad, 2112, 7168, 16, kH200Sms, {true, false}));
  bad.stages = 40;  // beyond the ring
  EXPECT_FALSE(engine_decision_legal(bad, 2112, 7168, 16, kH200Sms, {true, true}));
  bad.stages = 6;  // 6 x 34 KB and the partials: more than a CTA may have
  EXPECT_FALSE(engine_decision_legal(bad, 2112, 7168, 16, kH200Sms, {true, true}));
  bad.stages = 5;
  bad.clusters = 10;  // 2112 rows: 9 blocks of 256
  EXPECT_FALSE(engine_decision_legal(bad, 2112, 7168, 16, kH200Sms, {true, true}));
  EXPECT_FALSE(engine_decision_legal(wgmma_decision(1, 1, 8), 2112, 7168, 65, kH200Sms, {true, true}));
}

// The wide form (the weight tile as wgmma's B): its layout holds a 64-row activation
// tile per stage and partials only where a split needs them; its candidates are
// legal, each (split, rows, stages) once, none at 16 rows or fewer, fill the SMs in
// one wave where some split does, and a decision past the room or the rows is refused.
TEST(GemmRules, WideCandidatesAreLegal) {
  for (int rows : wgmma::kWideRows) {
    ASSERT_TRUE(wgmma::wide_shape_built(rows));
    for (int split : {1, 2, 8}) {
      const int stages = wgmma::wide_stages_within(rows, split, kWgmmaFullBudget);
      SCOPED_TRACE(testing::Message() << rows << " rows, split " << split);
      if (stages == 0) {  // 256 rows of 64 tokens' partials leave no room for 3 stages
        EXPECT_TRUE(split > 1 && rows == 256);
        continue;
      }
      const wgmma::Layout l = wgmma::wide_layout(rows, stages, split);
      EXPECT_EQ(l.x_bytes, wgmma::kTileRows * wgmma::kChunkK * 2);  // wgmma's A: 64 rows
      EXPECT_EQ(l.w_bytes, rows * wgmma::kChunkK * 2);
      EXPECT_EQ(l.barriers_offset, l.partials_offset + (split > 1 ? 2 * l.partial_bytes : 0));
      EXPECT_EQ(l.partial_bytes, wgmma::kMaxTokens * (rows + wgmma::kPartialPad) * 4);
      EXPECT_EQ(l.stage_bytes % wgmma::kAlign, 0);
      EXPECT_LE(l.smem_bytes, kWgmmaFullBudget);
      EXPECT_GT(wgmma::wide_layout(rows, stages + 1, split).smem_bytes,
                stages < wgmma::kMaxStages ? kWgmmaFullBudget : 0);
    }
  }
  EXPECT_FALSE(wgmma::wide_shape_built(64));  // 64 rows as B: the weight-as-A kernels' tile
  EXPECT_FALSE(wgmma::wide_shape_built(136));
  std::mt19937_64 rng(23);
  for (int trial = 0; trial < 300; ++trial) {
    const auto [n, k, m, engines] = random_wgmma_case(rng);
    SCOPED_TRACE(testing::Message() << n << "x" << k << " M " << m);
    const std::vector<GemmDecision> all_splits = wgmma_wide_candidates(n, k, m);
    const std::vector<GemmDecision> wide = wgmma_wide_candidates(n, k, m, kH200Sms);
    if (m <= kWideMinRows) EXPECT_TRUE(all_splits.empty());
    std::set<std::tuple<int, int, int>> seen;
    for (const GemmDecision& d : wide) {
      EXPECT_EQ(d.path, GemmPath::kWgmmaWide);
      EXPECT_TRUE(engine_decision_legal(d, n, k, m, kH200Sms, engines)) << describe(d);
      EXPECT_FALSE(engine_decision_legal(d, n, k, m, kH200Sms, {engines.warp, false}));
      EXPECT_FALSE(engine_decision_legal(d, n, k, kWideMinRows, kH200Sms, engines));
      EXPECT_TRUE(seen.insert({d.split, d.sub_tiles, d.stages}).second) << "a tactic twice: " << describe(d);
      // One wave: at most the SMs, unless the blocks alone are more (split 1).
      const int64_t blocks = (n + 8 * d.sub_tiles - 1) / (8 * d.sub_tiles);
      EXPECT_TRUE(blocks * d.split <= kH200Sms || d.split == 1) << describe(d);
      EXPECT_TRUE(std::find_if(all_splits.begin(), all_splits.end(),
                               [&](const GemmDecision& e) { return e.same_path(d); }) != all_splits.end());
    }
    // Every block size has a tactic (a split of one wave at least).
    if (m > kWideMinRows) EXPECT_GE(wide.size(), wgmma::kWideRows.size());
    const std::vector<GemmDecision> all = engine_candidates(n, k, m, engines, kH200Sms);
    EXPECT_EQ(std::count_if(all.begin(), all.end(), [](const GemmDecision& d) { return d.path == GemmPath::kWgmmaWide; }),
              engines.wgmma ? static_cast<std::ptrdiff_t>(wide.size()) : 0);
  }
  // 20480 rows: blocks of 160 fill 128 of 132 SMs at split 1.
  const std::vector<GemmDecision> lm_head = wgmma_wide_candidates(20480, 7168, 64, kH200Sms);
  EXPECT_TRUE(std::any_of(lm_head.begin(), lm_head.end(),
                          [](const GemmDecision& d) { return d.sub_tiles == 20 && d.split == 1; }));
  GemmDecision bad = wgmma_wide_decision(2, 256, 3);
  EXPECT_FALSE(engine_decision_legal(bad, 2112, 7168, 64, kH200Sms, {true, true}));  // partials of 64 tokens
  bad.split = 1;
  EXPECT_TRUE(engine_decision_legal(bad, 2112, 7168, 64, kH200Sms, {true, true}));
  bad.clusters = 10;  // 2112 rows: 9 blocks of 256
  EXPECT_FALSE(engine_decision_legal(bad, 2112, 7168, 64, kH200Sms, {true, true}));
  EXPECT_FALSE(engine_decision_legal(wgmma_wide_decision(1, 136, 4), 2112, 7168, 64, kH200Sms, {true, true}));
  EXPECT_EQ(describe(wgmma_wide_decision(2, 160, 5)), "wgmma-wide split 2 x 160 rows, 5 stages");
  EXPECT_FALSE(same_summation_order(wgmma_wide_decision(2, 256, 3), wgmma_decision(2, 4, 3)));
  EXPECT_TRUE(same_summation_order(wgmma_wide_decision(2, 256, 3), wgmma_wide_decision(2, 128, 6)));
}

// A batch-invariant GEMM keeps one engine at one split at every row count: the
// warp engine where the rule prefers it at the rows the calls mostly have, else the
// wgmma engine on the half-SM ring (the full one at 64 tokens); its decisions are legal.
TEST(GemmRules, InvariantDecisionsKeepOneEngineAndSplit) {
  EXPECT_EQ(invariant_split(2112, 7168, kH200Sms), 4);  // 33 blocks x 4 fill 132 SMs
  EXPECT_EQ(invariant_split(7168, 1536, kH200Sms), 2);  // 112 blocks
  EXPECT_EQ(invariant_split(20480, 7168, kH200Sms), 1);
  EXPECT_EQ(invariant_split(1000, 640, kH200Sms), 5);   // 10 chunks: two per CTA at most 5
  EXPECT_EQ(invariant_split(1000, 640, kH200Sms, true), 4);
  EXPECT_EQ(invariant_split(896, 35840, kH200Sms), 8);  // 14 blocks: the largest split
  // The narrow CTA's: its 16-row clusters resident at once (two CTAs per SM) and
  // filling the SMs.
  EXPECT_EQ(narrow_invariant_split(896, 35840, kH200Sms), 4);  // 56 clusters of 4: 62 fit, of 5: 47
  EXPECT_EQ(narrow_invariant_split(896, 35840, kH200Sms, true), 4);
  EXPECT_EQ(narrow_invariant_split(2112, 7168, kH200Sms), 2);  // 132 clusters of 2 fit, of 3 79
  EXPECT_EQ(narrow_invariant_split(1536, 7168, kH200Sms), 2);
  EXPECT_EQ(narrow_invariant_split(4608, 7168, kH200Sms), 0);  // 288 blocks: more than one wave at split 1
  EXPECT_EQ(narrow_invariant_split(512, 1024, kH200Sms), 0);   // 32 blocks x at most 4 leave SMs idle
  EXPECT_EQ(narrow_invariant_split(896, 35840, 66), 2);        // half the SMs: half the clusters fit
  struct Case {
    int64_t n, k;
    GemmEngines engines;
    bool shared;
    int rows;
    GemmPath path;
    int row_tiles = kWarpWarps;  // of a warp decision
  };
  const std::vector<Case> cases = {
      {2112, 7168, {true, true}, false, 8, GemmPath::kWarpSplitK},  // fused_qkv_a: the rule's warp split 8
      {2112, 7168, {true, true}, false, 1, GemmPath::kWarpSplitK},
      {2112, 7168, {true, true}, false, 17, GemmPath::kWgmma},     // the rule: cuBLAS above 16 rows
      {2112, 7168, {true, true}, false, 64, GemmPath::kWgmma},
      {7168, 2304, {true, true}, false, 8, GemmPath::kWarpSplitK},
      {7168, 2304, {true, true}, true, 8, GemmPath::kWarpSplitK},
      {896, 35840, {true, true}, false, 8, GemmPath::kWarpSplitK, 1},  // the rule prefers cuBLAS: narrow CTAs
      {896, 35840, {true, true}, true, 1, GemmPath::kWarpSplitK, 1},
      {896, 35840, {true, true}, false, 9, GemmPath::kWgmma},          // 2 token tiles: one narrow CTA per SM
      {896, 35840, {true, false}, false, 8, GemmPath::kWarpSplitK, 1},
      {896, 35840, {true, false}, false, 64, GemmPath::kWarpSplitK},   // no wgmma: the wide CTA all the same
      {4608, 7168, {true, true}, false, 64, GemmPath::kWgmma},
      {2112, 7168, {false, true}, false, 8, GemmPath::kWgmma},
      {1000, 640, {false, true}, false, 8, GemmPath::kWgmma},       // N % 16: not the warp engine's
      {1000, 640, {false, true}, true, 8, GemmPath::kWgmma},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << c.n << "x" << c.k << (c.shared ? " shared" : "") << " for " << c.rows);
    const GemmDecision first = invariant_decision(c.n, c.k, 1, kH200Sms, c.engines, c.shared, c.rows);
    EXPECT_EQ(first.path, c.path);
    if (c.path == GemmPath::kWarpSplitK) {
      EXPECT_EQ(int{first.sub_tiles}, c.row_tiles);
      EXPECT_EQ(first.split, c.row_tiles == 1 ? narrow_invariant_split(c.n, c.k, kH200Sms, c.shared)
                                              : choose_tactic(c.n, c.k, std::min(c.rows, kWarpCandidateMaxRows),
                                                              kH200Sms, c.shared)
                                                    .split);
    } else {
      EXPECT_EQ(first.split, invariant_split(c.n, c.k, kH200Sms, c.shared));
    }
    if (c.shared) EXPECT_TRUE(warp_split_for_shared_gpu(first.split)) << int{first.split};
    for (int m = 1; m <= kGemmMaxRows; ++m) {
      const GemmDecision d = invariant_decision(c.n, c.k, m, kH200Sms, c.engines, c.shared, c.rows);
      EXPECT_EQ(d.path, first.path) << m;
      EXPECT_EQ(d.split, first.split) << m;
      EXPECT_EQ(d.sub_tiles, first.sub_tiles) << m;
      EXPECT_EQ(d.source, GemmSource::kRule);
      if (d.path == GemmPath::kWgmma) {
        EXPECT_EQ(d.sub_tiles, 1);
        const int tokens = wgmma::token_tile(m);
        EXPECT_EQ(d.stages, wgmma::stages_within(1, tokens, tokens == 64 ? kWgmmaFullBudget : kWgmmaHalfBudget));
      }
      EXPECT_TRUE(engine_decision_legal(d, c.n, c.k, m, kH200Sms, c.engines)) << m;
    }
  }
  EXPECT_THROW(invariant_decision(256, 1000, 1, kH200Sms, {true, true}, false, 8), InvalidArgument);  // neither engine
  EXPECT_THROW(invariant_decision(2112, 7168, 1, kH200Sms, {}, false, 8), InvalidArgument);
  EXPECT_THROW(invariant_decision(2112, 7168, 65, kH200Sms, {true, true}, false, 8), InvalidArgument);
  EXPECT_THROW(invariant_decision(2112, 7168, 1, kH200Sms, {true, true}, false, 0), InvalidArgument);
  EXPECT_THROW(invariant_decision(2112, 7168, 1, kH200Sms, {true, true}, false, 65), InvalidArgument);
}

// The orders a tuned batch-invariant GEMM chooses among: every engine's CTA shapes at
// every legal split (powers of two on a shared GPU), each legal at every row count
// and, as it runs at any m, the same order; wgmma's ring and tiles follow m.
TEST(GemmRules, InvariantCandidatesRunEveryRowCountInOneOrder) {
  const auto all = invariant_candidates(896, 35840, 8, {true, true}, false);
  const std::size_t wgmma = wgmma_candidates(896, 35840, 8).size();
  // The wide CTA, the two narrow ones and the one-tile CTA's tensor-map form at splits
  // 1-8, the wgmma engine's candidates.
  EXPECT_EQ(all.size(), 32 + wgmma);
  EXPECT_EQ(invariant_candidates(896, 35840, 8, {true, true}, true).size(), 16 + wgmma / 2);  // splits 1, 2, 4, 8
  EXPECT_EQ(invariant_candidates(1000, 640, 8, {false, true}, false).size(), wgmma_candidates(1000, 640, 8).size());
  EXPECT_TRUE(invariant_candidates(256, 1000, 8, {true, true}, false).empty());  // neither engine
  for (const GemmDecision& c : all) {
    EXPECT_EQ(c.source, GemmSource::kTuned);
    for (int m = 1; m <= kGemmMaxRows; ++m) {
      const GemmDecision d = invariant_member(c, m);
      EXPECT_TRUE(same_summation_order(d, c)) << describe(c) << " at " << m;
      EXPECT_TRUE(engine_decision_legal(d, 896, 35840, m, kH200Sms, {true, true})) << describe(d) << " at " << m;
    }
  }
  const GemmDecision w = invariant_member(wgmma_decision(3, 4, 9, 7), 64);
  EXPECT_EQ(w.split, 3);
  EXPECT_EQ(w.sub_tiles, 1);
  EXPECT_EQ(w.clusters, 0);
  EXPECT_EQ(w.stages, wgmma::stages_within(1, 64, kWgmmaFullBudget));
  EXPECT_EQ(invariant_member(wgmma_decision(3, 1, 9), 8).stages, wgmma::stages_within(1, 8, kWgmmaHalfBudget));
  const GemmDecision two = invariant_member(wgmma_decision(3, 2, 12), 8);  // its tiles kept where built
  EXPECT_EQ(two.sub_tiles, 2);
  EXPECT_EQ(two.stages, wgmma::stages_within(2, 8, kWgmmaHalfBudget));
  EXPECT_EQ(invariant_member(wgmma_decision(3, 4, 6), 32).sub_tiles, 1);  // 4 tiles: 16 tokens at most
  EXPECT_TRUE(same_summation_order(wgmma_decision(2, 1, 4), wgmma_decision(2, 4, 9)));  // tiles and ring: same bits
  EXPECT_FALSE(same_summation_order(wgmma_decision(2, 1, 4), wgmma_decision(3, 1, 4)));
  EXPECT_FALSE(same_summation_order(warp_decision(2), warp_decision(2, 1)));  // wide and narrow CTAs
  EXPECT_FALSE(same_summation_order(warp_decision(2, 2), warp_decision(2, 1)));  // the two narrow CTAs
  EXPECT_FALSE(same_summation_order(warp_decision(2, 1), warp_decision(2, 1, true)));  // the one-tile CTA's forms
  EXPECT_TRUE(same_summation_order(warp_decision(2, 1, true), warp_decision(2, 1, true)));
  EXPECT_FALSE(same_summation_order(warp_decision(2), wgmma_decision(2, 1, 4)));
  EXPECT_FALSE(same_summation_order(cublas_decision(), cublas_decision()));  // cuBLAS promises no order
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

  EXPECT_TRUE(engine_activations_ok(TensorView::bf16(host, 1, 256)));
  EXPECT_TRUE(engine_activations_ok(TensorView::bf16(host, 64, 256)));
  EXPECT_FALSE(engine_activations_ok(TensorView::bf16(host, 65, 256)));
  EXPECT_FALSE(engine_activations_ok(TensorView::bf16(host + 4, 4, 256)));  // 8-byte aligned only
  EXPECT_FALSE(engine_activations_ok(TensorView::f32(host, 4, 256)));
  TensorView xs = TensorView::bf16(host, 4, 256);
  xs.row_stride = 384;
  EXPECT_FALSE(engine_activations_ok(xs));

  EXPECT_TRUE(wgmma_weight_ok(TensorView::bf16(host, 24, 64)));  // any N, K % 64
  EXPECT_FALSE(wgmma_weight_ok(TensorView::bf16(host, 24, 96)));
  EXPECT_FALSE(wgmma_weight_ok(TensorView::bf16(host + 1, 32, 256)));
  EXPECT_FALSE(wgmma_weight_ok(strided));
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
