// The drafter step on the CPU: the reduced reference step and its checks, the
// weight hash, per-TP shapes and sharding, the argmax rule, the op sequence.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/bf16.hpp"
#include "drafter/cpu_checks.hpp"
#include "drafter/cpu_reference.hpp"
#include "drafter/step.hpp"
#include "drafter/token_agreement.hpp"
#include "drafter/weight_hash.hpp"
#include "drafter/weights.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::drafter {
namespace {

TEST(DrafterStepCpu, ReducedReferenceStepChecksHold) {
  for (int rows : {1, 7, 14}) {
    for (const CheckResult& r : check_cpu_reference(DrafterConfig::reduced_cpu(), rows))
      EXPECT_TRUE(r.pass) << rows << " rows: " << r.name << ": " << r.detail;
  }
}

// Rows whose tokens differ from the stock path's, and the near ties among them: the
// stock logits of the two tokens within 4 BF16 ulps of the larger.
TEST(DrafterStepCpu, TokenAgreementCountsNearTies) {
  const int64_t vocab = 4;
  std::vector<uint16_t> logits(3 * vocab, bf16::from_float(0.0f));
  logits[0 * vocab + 1] = bf16::from_float(8.0f);
  logits[0 * vocab + 2] = bf16::from_float(7.875f);  // 2 ulps below (2^-4 at 8): a tie
  logits[1 * vocab + 0] = bf16::from_float(8.0f);
  logits[1 * vocab + 3] = bf16::from_float(7.5f);  // 8 ulps below: no tie
  logits[2 * vocab + 2] = bf16::from_float(1.0f);
  const TokenAgreement a = compare_tokens(logits, {1, 0, 2}, {2, 3, 2}, vocab);
  EXPECT_EQ(a.disagreements, 2);
  EXPECT_EQ(a.near_ties, 1);
  const TokenAgreement same = compare_tokens(logits, {1, 0, 2}, {1, 0, 2}, vocab);
  EXPECT_EQ(same.disagreements, 0);
}

TEST(DrafterStepCpu, TokensDependOnTheSeed) {
  DrafterConfig a = DrafterConfig::reduced_cpu(), b = a;
  b.seed = 2;
  CpuReference ra(a, 14), rb(b, 14);
  ra.run();
  rb.run();
  EXPECT_NE(ra.buffer(Buf::kLogits), rb.buffer(Buf::kLogits));
  // The logits are not degenerate: the draft tokens are not all one value.
  int distinct = 0;
  for (std::size_t i = 1; i < ra.tokens().size(); ++i) distinct += ra.tokens()[i] != ra.tokens()[0];
  EXPECT_GT(distinct, 0);
}

TEST(DrafterStepCpu, WeightHashIsReproducibleAndSeeded) {
  const DrafterConfig c = DrafterConfig::reduced_cpu();
  const FillSpec f = weight_fill(c, {Tensor::kQB, 1}, 2, 1);
  EXPECT_EQ(host_fill(f), host_fill(f));
  FillSpec other = f;
  other.seed = f.seed + 1;
  EXPECT_NE(host_fill(f), host_fill(other));
  EXPECT_NE(host_fill(weight_fill(c, {Tensor::kQB, 0}, 2, 1)), host_fill(f));  // layers differ
  for (uint64_t i = 0; i < 1000; ++i) {
    const float u = element_uniform(7, 3, i, i * 31);
    EXPECT_GE(u, -1.0f);
    EXPECT_LT(u, 1.0f);
  }
  // Norm weights are near 1, linear weights are O(1/sqrt(K)).
  for (uint16_t w : host_fill(weight_fill(c, {Tensor::kInputNorm, 0}, 1, 0)))
    EXPECT_NEAR(bf16::to_float(w), 1.0f, 0.1f + 1.0f / 128);  // 1 ± 0.1, rounded
  for (uint16_t w : host_fill(weight_fill(c, {Tensor::kDown, 0}, 1, 0)))
    EXPECT_LE(std::abs(bf16::to_float(w)), std::sqrt(3.0f / static_cast<float>(c.intermediate)) * 1.01f);
}

TEST(DrafterStepCpu, ShapesPerTeamSize) {
  const DrafterConfig c = DrafterConfig::reference();
  for (int tp : {1, 2, 4, 8}) {
    const RankShapes s = rank_shapes(c, tp);
    EXPECT_EQ(s.heads, 96 / tp);
    EXPECT_EQ(s.q, 96 / tp * 192);
    EXPECT_EQ(s.attn, 96 / tp * 128);
    EXPECT_EQ(s.gate_up, 2 * 18432 / tp);
    EXPECT_EQ(s.intermediate, 18432 / tp);
    EXPECT_EQ(s.vocab, 163840 / tp);
    EXPECT_EQ(s.context, 7168 / tp);
    const auto shape = [&](Tensor t) {
      const ShardMap m = weight_fill(c, {t, 0}, tp, tp - 1).map;
      return std::pair<int64_t, int64_t>(m.rows, m.cols);
    };
    using P = std::pair<int64_t, int64_t>;
    EXPECT_EQ(shape(Tensor::kQkvA), P(2112, 7168));
    EXPECT_EQ(shape(Tensor::kQB), P(96 / tp * 192, 1536));
    EXPECT_EQ(shape(Tensor::kOProj), P(7168, 96 / tp * 128));
    EXPECT_EQ(shape(Tensor::kGateUp), P(2 * 18432 / tp, 7168));
    EXPECT_EQ(shape(Tensor::kDown), P(7168, 18432 / tp));
    EXPECT_EQ(shape(Tensor::kLmHead), P(163840 / tp, 7168));
    EXPECT_EQ(shape(Tensor::kEmbedding), P(163840 / tp, 7168));
    EXPECT_EQ(shape(Tensor::kContextProj), P(7168 / tp, 35840));
  }
  // docs/drafter.md's per-rank table at TP 8.
  EXPECT_EQ(weight_fill(c, {Tensor::kQB, 0}, 8, 0).map.rows, 2304);
  EXPECT_EQ(weight_fill(c, {Tensor::kContextProj, 0}, 8, 0).map.rows, 896);
  EXPECT_TRUE(shard_refusal(c, 16).empty());
  EXPECT_FALSE(shard_refusal(c, 3).empty());
  EXPECT_THROW(rank_shapes(c, 5), InvalidArgument);
}

TEST(DrafterStepCpu, EveryLinearIsShardedExactly) {
  const DrafterConfig c = DrafterConfig::reduced_cpu();
  for (int tp : {1, 2, 4, 8})
    for (Tensor t : {Tensor::kEmbedding, Tensor::kQkvA, Tensor::kQB, Tensor::kOProj, Tensor::kGateUp, Tensor::kDown,
                     Tensor::kContextProj, Tensor::kLmHead})
      EXPECT_TRUE(shards_tile_weight(c, {t, 1}, tp)) << "tensor " << static_cast<int>(t) << " TP " << tp;
  // gate_up: a rank's shard is its gate rows, then its up rows.
  const ShardMap m = weight_fill(c, {Tensor::kGateUp, 0}, 4, 2).map;
  EXPECT_EQ(m.global_row(0), 2 * c.intermediate / 4);
  EXPECT_EQ(m.global_row(c.intermediate / 4), c.intermediate + 2 * c.intermediate / 4);
}

TEST(DrafterStepCpu, ArgmaxTakesTheLowestIndexOfTheMaximum) {
  const auto b = [](float v) { return bf16::from_float(v); };
  EXPECT_EQ(argmax_lowest(std::vector<uint16_t>{b(1), b(3), b(2), b(3)}), 1);
  EXPECT_EQ(argmax_lowest(std::vector<uint16_t>{b(-5), b(-5)}), 0);
  const uint16_t nan = 0x7fc0;
  EXPECT_EQ(argmax_lowest(std::vector<uint16_t>{nan, b(-1), nan, b(2)}), 3);
  EXPECT_EQ(argmax_lowest(std::vector<uint16_t>{nan, nan}), 0);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(argmax_lowest(std::vector<uint16_t>{b(-inf), b(-inf), b(-inf)}), 0);
}

TEST(DrafterStepCpu, OpSequenceCounts) {
  const StepOpCounts tp8 = count_step_ops(DrafterConfig::reference(), 8);
  EXPECT_EQ(tp8.ar_norms, 11);
  EXPECT_EQ(tp8.gathers, 2);
  EXPECT_EQ(tp8.gemms, 27);
  EXPECT_EQ(tp8.norms, 10);  // q_a and kv norms per layer
  const StepOpCounts tp1 = count_step_ops(DrafterConfig::reference(), 1);
  EXPECT_EQ(tp1.ar_norms, 11);
  EXPECT_EQ(tp1.gathers, 0);
  EXPECT_EQ(count_step_ops(DrafterConfig::reduced_cpu(), 2).ar_norms, 5);
}

// The step's floor counts these bytes: docs/drafter.md's per-rank linears (each
// read once per layer, the lm_head and the context projection once) and the norm
// weights (per layer: input, q_a, kv, post-attention; then the final norm); the
// embedding lookup is not counted.
TEST(DrafterStepCpu, WeightBytesPerRank) {
  const int64_t norms = 5 * (7168 + 1536 + 512 + 7168) + 7168;
  const int64_t tp8_layer = 2112 * 7168 + 2304 * 1536 + 7168 * 1536 + 4608 * 7168 + 7168 * 2304;
  const int64_t tp8 = 5 * tp8_layer + 20480 * 7168 + 896 * 35840 + norms;
  EXPECT_EQ(count_step_ops(DrafterConfig::reference(), 8).weight_bytes, 2 * tp8);
  EXPECT_EQ(2 * tp8, 1150334976);  // about 1.15 GB per rank at TP 8
  const int64_t tp1_layer = 2112 * 7168 + 18432 * 1536 + 7168 * 12288 + 36864 * 7168 + 7168 * 18432;
  const int64_t tp1 = 5 * tp1_layer + 163840 * int64_t{7168} + 7168 * 35840 + norms;
  EXPECT_EQ(count_step_ops(DrafterConfig::reference(), 1).weight_bytes, 2 * tp1);
  EXPECT_EQ(2 * tp1, 8141715456);  // docs/performance.md's 8.14 GB at TP 1
}

TEST(DrafterStepCpu, LocalNormSumOrder) {
  std::vector<uint16_t> ones(512, bf16::from_float(1.0f));
  EXPECT_EQ(local_norm_square_sum(ones), 512.0f);
  // Columns past the thread count fold into thread c mod 256: 1 + 3² at thread 0.
  std::vector<uint16_t> row(257, 0);
  row[0] = bf16::from_float(1.0f);
  row[256] = bf16::from_float(3.0f);
  EXPECT_EQ(local_norm_square_sum(row), 10.0f);
}

}  // namespace
}  // namespace tpdecode::drafter
