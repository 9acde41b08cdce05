// DecodeGemm's host rules (seed 004 eligibility, the tactic rule, which operands
// the engines take, the stream-K engine's variants and work split, the M buckets,
// the candidates the tuner times) and the FP64 reference GEMM the device tests trust.
#include <algorithm>
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <type_traits>
#include <vector>

#include "gemm/stream_k_plan.hpp"
#include "tpdecode/bf16.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/gemm_tactic.hpp"
#include "reference/gemm.hpp"

namespace tpdecode {
namespace {

constexpr int kH200Sms = 132;

TEST(GemmRules, WarpEligibility) {
  EXPECT_TRUE(warp_eligible(2112, 7168));     // fused_qkv_a: 56 chunks of 128
  EXPECT_TRUE(warp_eligible(16, 128));
  EXPECT_TRUE(warp_eligible(16, 8320));       // 65 chunks, K % 256 != 0 (beyond seed 004's bound)
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
  EXPECT_NO_THROW(tactic_with_split(7168, 7168, 4, kH200Sms, 3));                // any cluster size up to 8
  EXPECT_THROW(tactic_with_split(7168, 7168, 4, kH200Sms, 9), InvalidArgument);
  EXPECT_THROW(tactic_with_split(7168, 7168, 4, kH200Sms, 0), InvalidArgument);
  EXPECT_THROW(tactic_with_split(7168, 1536, 4, kH200Sms, 7), InvalidArgument);  // 12 chunks: < 2 per rank
  EXPECT_NO_THROW(tactic_with_split(7168, 1536, 4, kH200Sms, 6));
  EXPECT_THROW(tactic_with_split(7160, 7168, 4, kH200Sms, 1), InvalidArgument);  // not eligible
}

TEST(GemmRules, BucketsPartitionTheRowsWithinTokenTiles) {
  int expected = 0;
  for (int m = 1; m <= kWarpMaxRows; ++m) {
    const int b = gemm_m_bucket(m);
    if (m > 1 && b != gemm_m_bucket(m - 1)) ++expected;
    EXPECT_EQ(b, expected) << m;
    EXPECT_LE(gemm_bucket_min(b), m);
    EXPECT_GE(gemm_bucket_max(b), m);
    EXPECT_EQ(warp_token_tiles(gemm_bucket_min(b)), warp_token_tiles(gemm_bucket_max(b))) << "bucket " << b;
  }
  EXPECT_EQ(expected, kGemmBuckets - 1);
  EXPECT_EQ(gemm_m_bucket(7), gemm_m_bucket(8));    // 5-8
  EXPECT_NE(gemm_m_bucket(13), gemm_m_bucket(12));  // 13-16 vs 9-12
  EXPECT_THROW(gemm_m_bucket(0), InvalidArgument);
  EXPECT_THROW(gemm_m_bucket(33), InvalidArgument);
  EXPECT_THROW(gemm_bucket_max(kGemmBuckets), InvalidArgument);
}

TEST(GemmRules, StreamEligibility) {
  EXPECT_TRUE(stream_eligible(2112, 7168));
  EXPECT_TRUE(stream_eligible(7168, 18432));   // TP1 down
  EXPECT_TRUE(stream_eligible(896, 35840));    // context projection
  EXPECT_TRUE(stream_eligible(16, 128));
  EXPECT_FALSE(stream_eligible(2120, 7168));   // N % 16
  EXPECT_FALSE(stream_eligible(2112, 7200));   // K % 128
  EXPECT_FALSE(stream_eligible(0, 128));
  EXPECT_FALSE(stream_eligible(int64_t{1} << 30, int64_t{1} << 11));  // N * K > 2^40
}

TEST(GemmRules, StreamVariantsFitTheirShareOfTheSm) {
  for (int m : {1, 8, 9, 16, 17, 32})
    for (int v = 0; v < static_cast<int>(kStreamVariants.size()); ++v) {
      SCOPED_TRACE(testing::Message() << "M " << m << " v" << v);
      if (!stream_variant_fits(m, v)) {
        EXPECT_THROW(stream_tactic(4608, 7168, m, kH200Sms, v), InvalidArgument);
        continue;
      }
      const StreamTactic t = stream_tactic(4608, 7168, m, kH200Sms, v);
      const StreamVariant& sv = kStreamVariants[static_cast<std::size_t>(v)];
      EXPECT_GE(t.stages, kStreamMinStages);
      EXPECT_LE(t.stages, kStreamMaxStages);
      EXPECT_LE(t.smem_bytes, kSmemPerCtaMax);
      // The share: smem_share CTAs (ours or the next kernel's) fit on one SM.
      EXPECT_LE(sv.smem_share * (t.smem_bytes + kSmemReservedPerCta), kSmemPerSm);
      EXPECT_EQ(t.ctas, sv.ctas_per_sm * kH200Sms);
      EXPECT_EQ(t.stage_cols % stream_k::kStepCols, 0);
      // Each stage's copies fit an mbarrier's transaction count (2^20 - 1 bytes).
      EXPECT_LT((stream_k::kRows + 8 * t.token_tiles) * t.stage_cols * 2, 1 << 20);
    }
  // Every M has a variant with the deepest ring and one that leaves room beside it.
  for (int m = 1; m <= kWarpMaxRows; ++m) {
    EXPECT_TRUE(stream_variant_fits(m, 0)) << m;
    EXPECT_TRUE(stream_variant_fits(m, 2)) << m;
  }
  EXPECT_TRUE(stream_variant_fits(8, 1));
  EXPECT_FALSE(stream_variant_fits(9, 1));  // 1 KB stages hold only 2 at 16 rows
}

TEST(GemmRules, StreamLayoutIsAlignedAndDisjoint) {
  for (int tiles : {1, 2, 4})
    for (int cols : {128, 256, 512})
      for (int stages = 1; stages <= kStreamMaxStages; ++stages) {
        const stream_k::Layout l = stream_k::layout(tiles, cols, stages);
        EXPECT_EQ(l.row_bytes % 16, 0);
        EXPECT_EQ(l.row_bytes % 128, 16);  // 8 consecutive rows in 8 bank groups
        EXPECT_GE(l.empty_off, l.full_off + 8 * stages);
        EXPECT_GE(l.flag_off, l.empty_off + 8 * stages);
        EXPECT_GE(l.w_off, l.flag_off + 4);
        EXPECT_EQ(l.w_off % 128, 0);
        EXPECT_EQ(l.x_off, l.w_off + stages * 64 * l.row_bytes);
        EXPECT_EQ(l.red_off, l.x_off + stages * 8 * tiles * l.row_bytes);
        EXPECT_EQ(l.red_off % 16, 0);
        EXPECT_EQ(l.total, l.red_off + 8 * tiles * stream_k::kRedStride * 4);
      }
}

TEST(GemmRules, StreamTacticCoversSmallWeights) {
  const StreamTactic tiny = stream_tactic(16, 128, 1, kH200Sms, 0);  // 8 steps of one tile
  EXPECT_EQ(tiny.tiles, 1);
  EXPECT_EQ(tiny.total_steps, 8);
  EXPECT_EQ(tiny.ctas, 1);
  const StreamTactic qb = stream_tactic(2304, 1536, 4, kH200Sms, 3);  // TP8 q_b: 36 tiles x 96 steps
  EXPECT_EQ(qb.total_steps, 36 * 96);
  EXPECT_EQ(qb.ctas, 2 * kH200Sms);
  // One tile of 64 steps: at most 8 CTAs of 8 steps each, fewer on fewer SMs.
  for (int sms : {1, 7, 132}) EXPECT_EQ(stream_tactic(64, 1024, 8, sms, 0).ctas, std::min(sms, 8));
}

// The work split, as the kernel walks it: every (tile, step) once, in whole ranges of
// nearly equal length; a split tile's contributors consecutive, each in at most two
// workspace slots, its counter used by no other split tile.
TEST(GemmRules, StreamWorkSplitCoversEveryStepOnce) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t tiles = 1 + static_cast<int64_t>(rng() % 300);
    // Steps per tile: K / 16 (a multiple of 8); CTAs: at least one step each (the
    // tactic gives each at least kMinStepsPerCta).
    const int64_t spt = 8 * static_cast<int64_t>(1 + rng() % 300);
    const int64_t total = tiles * spt;
    const int ctas = static_cast<int>(std::min<int64_t>(1 + rng() % 3000, total));
    const int stage_steps = std::array<int, 3>{8, 16, 32}[rng() % 3];
    SCOPED_TRACE(testing::Message() << tiles << " tiles x " << spt << " steps, " << ctas << " CTAs");
    std::vector<int> seen(static_cast<std::size_t>(total), 0);
    std::vector<int> slot_used(static_cast<std::size_t>(ctas) * 2, 0);
    int64_t shortest = total, longest = 0;
    for (int c = 0; c < ctas; ++c) {
      const int64_t begin = stream_k::range_begin(total, ctas, c);
      const int64_t end = stream_k::range_begin(total, ctas, c + 1);
      ASSERT_LT(begin, end);  // no empty range
      shortest = std::min(shortest, end - begin);
      longest = std::max(longest, end - begin);
      int64_t pos = begin;
      for (stream_k::StageCursor cur{begin, end, spt, stage_steps}; cur.valid(); cur.next()) {
        ASSERT_EQ(cur.pos, pos);
        ASSERT_GE(cur.width(), 1);
        ASSERT_LE(cur.width(), stage_steps);
        ASSERT_EQ(cur.tile(), (cur.pos + cur.width() - 1) / spt) << "a stage crosses a tile";
        for (int64_t s = cur.pos; s < cur.pos + cur.width(); ++s) {
          ++seen[static_cast<std::size_t>(s)];
          ASSERT_EQ(stream_k::cta_of(total, ctas, s), c);
        }
        pos += cur.width();
        if (cur.ends_segment()) {
          const stream_k::Contributors who = stream_k::contributors(total, ctas, spt, cur.tile());
          ASSERT_LE(who.first, c);
          ASSERT_GE(who.last, c);
          if (who.first != who.last)
            ++slot_used[static_cast<std::size_t>(c) * 2 +
                        static_cast<std::size_t>(stream_k::partial_slot(total, ctas, spt, c, cur.tile()))];
        }
      }
      ASSERT_EQ(pos, end);
    }
    EXPECT_LE(longest - shortest, 1);
    for (int64_t s = 0; s < total; ++s) ASSERT_EQ(seen[static_cast<std::size_t>(s)], 1) << "step " << s;
    for (int used : slot_used) EXPECT_LE(used, 1) << "a workspace slot holds two partials";
    std::set<int> counters;
    for (int64_t t = 0; t < tiles; ++t) {
      const stream_k::Contributors who = stream_k::contributors(total, ctas, spt, t);
      if (who.first == who.last) continue;
      EXPECT_TRUE(counters.insert(who.first).second) << "tile " << t << " shares its counter";
    }
  }
}

TEST(GemmRules, CandidatesAreLegalAndEndWithCublas) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = 16 * static_cast<int64_t>(1 + rng() % 4096);
    const int64_t k = 128 * static_cast<int64_t>(1 + rng() % 300);
    const int m = 1 + static_cast<int>(rng() % kWarpMaxRows);
    const GemmEngines engines{warp_eligible(n, k), stream_eligible(n, k)};
    const std::vector<GemmDecision> c = engine_candidates(n, k, m, engines);
    ASSERT_FALSE(c.empty());
    EXPECT_EQ(c.back().path, GemmPath::kCublas);
    int streams = 0;
    int warps = 0;
    for (const GemmDecision& d : c) {
      EXPECT_TRUE(engine_decision_legal(d, n, k, m, kH200Sms, engines)) << describe(d) << " " << n << "x" << k;
      streams += d.path == GemmPath::kStreamK;
      warps += d.path == GemmPath::kWarpSplitK;
    }
    EXPECT_GE(streams, 2) << n << "x" << k << " M " << m;
    // Every split up to 8 that leaves each cluster rank two chunks, odd ones too.
    const int64_t chunks = k / kWarpChunkK;
    const int splits = engines.warp ? static_cast<int>(std::min<int64_t>(kWarpMaxSplit, std::max<int64_t>(1, chunks / 2))) : 0;
    EXPECT_EQ(warps, splits) << n << "x" << k;
    EXPECT_TRUE(engine_decision_legal(rule_decision(n, k, m, kH200Sms, engines), n, k, m, kH200Sms, engines));
  }
  // No engine: cuBLAS alone.
  const std::vector<GemmDecision> none = engine_candidates(2112, 7168, 4, GemmEngines{});
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0].path, GemmPath::kCublas);
  GemmDecision bad;
  bad.path = GemmPath::kStreamK;
  bad.variant = 1;
  EXPECT_FALSE(engine_decision_legal(bad, 2112, 7168, 16, kH200Sms, {true, true}));  // v1 holds 8 rows at most
  bad.variant = 9;
  EXPECT_FALSE(engine_decision_legal(bad, 2112, 7168, 4, kH200Sms, {true, true}));
  bad.path = GemmPath::kWarpSplitK;
  bad.split = 9;
  EXPECT_FALSE(engine_decision_legal(bad, 2112, 7168, 4, kH200Sms, {true, true}));
}

TEST(GemmRules, RuleKeepsTheMeasuredWarpCases) {
  const GemmEngines both{true, true};
  EXPECT_EQ(rule_decision(2112, 7168, 1, kH200Sms, both).path, GemmPath::kWarpSplitK);
  EXPECT_EQ(rule_decision(2112, 7168, 1, kH200Sms, both).split, 8);
  EXPECT_EQ(rule_decision(4608, 7168, 1, kH200Sms, both).path, GemmPath::kCublas);
  EXPECT_EQ(rule_decision(2112, 7168, 1, kH200Sms, {false, true}).path, GemmPath::kCublas);
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
  EXPECT_EQ(std::string(gemm_path_name(GemmPath::kStreamK)), "stream");
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
  EXPECT_TRUE(stream_weight_ok(w));
  EXPECT_FALSE(stream_weight_ok(strided));
  EXPECT_FALSE(stream_weight_ok(TensorView::bf16(host + 1, 32, 256)));

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
