// DrafterComm and the stock path on the local team: build rules, not-served calls
// launch nothing, stock == specialised, 10,000 back-to-back calls mixing ops and
// parities.
#include <gtest/gtest.h>

#include <algorithm>

#include "gpu/comm_test_util.hpp"
#include "tpdecode/bf16.hpp"
#include "tpdecode/drafter_comm.hpp"
#include "tpdecode/local_team.hpp"
#include "reference/gather.hpp"
#include "tpdecode/stock_comm.hpp"

namespace tpdecode {
namespace {

using test::DeviceBuffer;

TEST(DrafterComm, BuildGivesNothingAtTp1AndServesTp8) {
  TPD_REQUIRE_GPU();
  LocalTeam one(1);
  std::string why;
  EXPECT_EQ(DrafterComm::build(one, {}, &why), nullptr);
  EXPECT_NE(why, "");
  LocalTeam team(8);
  DrafterCommConfig config;
  config.vocab_shard = 20480;
  auto comm = DrafterComm::build(team, config, &why);
  ASSERT_NE(comm, nullptr) << why;
  const DrafterCommLimits& l = comm->limits();
  EXPECT_EQ(l.team_size, 8);
  EXPECT_EQ(l.vocab_shard, 20480);
  EXPECT_GE(l.ar_norm_resident_rows, 1);
  EXPECT_LT(l.ar_norm_resident_rows, 64) << "one GPU cannot hold 8 ranks x 64 rows of ArNorm clusters";
  EXPECT_EQ(l.gather_resident_rows, 64);
  std::printf("DrafterComm at TP 8 on one GPU: ar_norm serves up to %d rows\n", l.ar_norm_resident_rows);

  // Rows above what fits: not served, nothing launched, the stock path runs.
  std::mt19937_64 rng(test::fresh_seed());
  const int rows = l.ar_norm_resident_rows + 1;
  const test::ArNormCase c = test::make_ar_norm_case(8, rows, 7168, true, rng);
  EXPECT_FALSE(comm->ar_norm(0, c.io(0), 0));
  StockCommConfig sc;
  sc.max_row_bytes = 7168 * 2;
  StockComm stock(team, sc);
  std::vector<ArNormIo> io;
  for (int k = 0; k < 8; ++k) io.push_back(c.io(k));
  stock.ar_norm(io);
  team.synchronize();
  team.check_errors();
  const test::ArNormCheck r = test::check_ar_norm(c);
  EXPECT_EQ(r.residual_mismatches, 0);
  EXPECT_EQ(r.out_over_one_ulp, 0);
  EXPECT_EQ(r.ranks_differing, 0);
}

// The stock path's norm kernel shares ArNorm's math: identical bits (the inputs
// hold no sentinel words, which only ArNorm's transport cleans).
TEST(DrafterComm, BitwiseStockEqualsSpecialised) {
  TPD_REQUIRE_GPU();
  constexpr int kRanks = 4, kHidden = 7168;
  LocalTeam team(kRanks);
  DrafterCommConfig config;
  config.vocab_shard = 1024;
  auto comm = DrafterComm::build(team, config);
  ASSERT_NE(comm, nullptr);
  StockCommConfig sc;
  sc.max_row_bytes = kHidden * 2;
  StockComm stock(team, sc);
  std::mt19937_64 rng(test::fresh_seed());
  const int most = std::min(32, comm->limits().ar_norm_resident_rows);
  for (int rows : {1, 7, most}) {
    for (bool residual : {true, false}) {
      SCOPED_TRACE(testing::Message() << "rows " << rows << " residual " << residual);
      test::ArNormCase mine = test::make_ar_norm_case(kRanks, rows, kHidden, residual, rng);
      for (int k = 0; k < kRanks; ++k) {  // no sentinel words
        for (auto& v : mine.x_host[k])
          if (v == 0x8000) v = 0x0001;
        test::upload(mine.x[k], mine.x_host[k].data(), mine.x_host[k].size() * 2);
      }
      for (int k = 0; k < kRanks; ++k) ASSERT_TRUE(comm->ar_norm(k, mine.io(k), rows % 2));
      team.synchronize();
      team.check_errors();
      std::vector<std::vector<uint16_t>> special_out, special_res;
      const std::size_t n = static_cast<std::size_t>(rows) * kHidden;
      for (int k = 0; k < kRanks; ++k) {
        special_out.push_back(test::to_host<uint16_t>(mine.out[k], n));
        special_res.push_back(test::to_host<uint16_t>(mine.res_out[k], n));
        test::poison(mine.out[k]);
        test::poison(mine.res_out[k]);
      }
      std::vector<ArNormIo> io;
      for (int k = 0; k < kRanks; ++k) io.push_back(mine.io(k));
      stock.ar_norm(io);
      team.synchronize();
      for (int k = 0; k < kRanks; ++k) {
        EXPECT_EQ(test::to_host<uint16_t>(mine.out[k], n), special_out[k]) << "rank " << k;
        EXPECT_EQ(test::to_host<uint16_t>(mine.res_out[k], n), special_res[k]) << "rank " << k;
      }
    }
  }
}

TEST(DrafterComm, GatherBytesStockAndSpecialisedAgreeWithReference) {
  TPD_REQUIRE_GPU();
  constexpr int kRanks = 8, kRows = 9, kShard = 7168 / kRanks;
  LocalTeam team(kRanks);
  auto comm = DrafterComm::build(team, {});
  ASSERT_NE(comm, nullptr);
  StockCommConfig sc;
  sc.max_row_bytes = kShard * 2;
  StockComm stock(team, sc);
  std::mt19937_64 rng(test::fresh_seed());
  std::vector<std::vector<uint32_t>> host;
  std::vector<DeviceBuffer> shard, special, plain;
  std::vector<TensorView> shards, plains;
  for (int k = 0; k < kRanks; ++k) {
    host.push_back(test::random_words(kRows * kShard / 2, rng));
    shard.push_back(test::to_device(host.back()));
    special.emplace_back(kRows * 7168 * 2);
    plain.emplace_back(kRows * 7168 * 2);
    test::poison(special.back());
    test::poison(plain.back());
    shards.push_back(TensorView::bf16(shard.back().get(), kRows, kShard));
    plains.push_back(TensorView::bf16(plain.back().get(), kRows, 7168));
  }
  for (int k = 0; k < kRanks; ++k)
    ASSERT_TRUE(comm->gather_context(k, shards[k], TensorView::bf16(special[k].get(), kRows, 7168), 1));
  EXPECT_FALSE(comm->gather_logits(0, shards[0], plains[0], 0)) << "no vocabulary shard was configured";
  stock.all_gather(shards, plains);
  team.synchronize();
  team.check_errors();
  const std::vector<uint32_t> cleaned = reference::gather(host, kRows, kShard / 2);
  for (int k = 0; k < kRanks; ++k) {
    EXPECT_EQ(test::to_host<uint32_t>(special[k], cleaned.size()), cleaned) << "rank " << k;
    // The stock gather moves the bytes unchanged: sentinel words stay.
    std::vector<uint32_t> raw = test::to_host<uint32_t>(plain[k], cleaned.size());
    long differ = 0;
    for (std::size_t i = 0; i < raw.size(); ++i)
      differ += raw[i] != cleaned[i] && !(raw[i] == 0x80000000u && cleaned[i] == 0);
    EXPECT_EQ(differ, 0) << "rank " << k;
  }
}

// 10,000 calls (200 under TPDECODE_QUICK) without a host sync: ar_norm with and
// without residual, the context gather and the logits gather, each alternating its
// parities; every call's output is kept and compared.
TEST(DrafterComm, BackToBackCallsMixingOpsAndParities) {
  TPD_REQUIRE_GPU();
  const int calls = test::quick() ? 200 : 10000;
  constexpr int kRanks = 4, kRows = 2, kHidden = 4096, kVocabShard = 64, kSets = 8;
  LocalTeam team(kRanks);
  DrafterCommConfig config;
  config.hidden = kHidden;
  config.vocab_shard = kVocabShard;
  auto comm = DrafterComm::build(team, config);
  ASSERT_NE(comm, nullptr);
  std::mt19937_64 rng(test::fresh_seed());
  std::vector<test::ArNormCase> ar;
  std::vector<std::vector<std::vector<uint32_t>>> ctx_host, logit_host;  // [set][rank]
  std::vector<std::vector<DeviceBuffer>> ctx_dev, logit_dev;
  for (int s = 0; s < kSets; ++s) {
    ar.push_back(test::make_ar_norm_case(kRanks, kRows, kHidden, s % 2 == 0, rng));
    ctx_host.emplace_back();
    logit_host.emplace_back();
    ctx_dev.emplace_back();
    logit_dev.emplace_back();
    for (int k = 0; k < kRanks; ++k) {
      ctx_host.back().push_back(test::random_words(kRows * kHidden / kRanks / 2, rng));
      logit_host.back().push_back(test::random_words(kRows * kVocabShard / 2, rng));
      ctx_dev.back().push_back(test::to_device(ctx_host.back().back()));
      logit_dev.back().push_back(test::to_device(logit_host.back().back()));
    }
  }
  // Per op, one output slot per call of that op: [calls_of_op, rows, width] bf16.
  const int per_op = (calls + 3) / 4 * 2;  // ar_norm takes two of every four calls
  const std::size_t ar_elems = static_cast<std::size_t>(kRows) * kHidden;
  const std::size_t logit_elems = static_cast<std::size_t>(kRows) * kVocabShard * kRanks;
  std::vector<DeviceBuffer> ar_out, ar_res, ctx_out, logit_out;
  for (int k = 0; k < kRanks; ++k) {
    ar_out.emplace_back(ar_elems * 2 * per_op);
    ar_res.emplace_back(ar_elems * 2 * per_op);
    ctx_out.emplace_back(ar_elems * 2 * per_op);
    logit_out.emplace_back(logit_elems * 2 * per_op);
  }
  int n_ar = 0, n_ctx = 0, n_logit = 0;
  std::vector<int> ar_set, ctx_set, logit_set;
  for (int c = 0; c < calls; ++c) {
    const int s = c % kSets;
    const int op = c % 4;  // 0, 2: ar_norm; 1: context gather; 3: logits gather
    for (int k = 0; k < kRanks; ++k) {
      if (op == 0 || op == 2) {
        ArNormIo io = ar[static_cast<std::size_t>(s)].io(k);
        io.out.data = ar_out[k].as<uint16_t>() + ar_elems * n_ar;
        io.residual_out.data = ar_res[k].as<uint16_t>() + ar_elems * n_ar;
        ASSERT_TRUE(comm->ar_norm(k, io, n_ar % 2));
      } else if (op == 1) {
        ASSERT_TRUE(comm->gather_context(k, TensorView::bf16(ctx_dev[s][k].get(), kRows, kHidden / kRanks),
                                         TensorView::bf16(ctx_out[k].as<uint16_t>() + ar_elems * n_ctx, kRows, kHidden),
                                         n_ctx % 2));
      } else {
        ASSERT_TRUE(comm->gather_logits(
            k, TensorView::bf16(logit_dev[s][k].get(), kRows, kVocabShard),
            TensorView::bf16(logit_out[k].as<uint16_t>() + logit_elems * n_logit, kRows, kVocabShard * kRanks),
            n_logit % 2));
      }
    }
    if (op == 0 || op == 2) ar_set.push_back(s), ++n_ar;
    else if (op == 1) ctx_set.push_back(s), ++n_ctx;
    else logit_set.push_back(s), ++n_logit;
  }
  team.synchronize();
  team.check_errors();
  std::vector<reference::ArNormResult> ar_ref;
  std::vector<std::vector<uint32_t>> ctx_ref, logit_ref;
  for (int s = 0; s < kSets; ++s) {
    ar_ref.push_back(ar[static_cast<std::size_t>(s)].reference());
    ctx_ref.push_back(reference::gather(ctx_host[s], kRows, kHidden / kRanks / 2));
    logit_ref.push_back(reference::gather(logit_host[s], kRows, kVocabShard / 2));
  }
  for (int k = 0; k < kRanks; ++k) {
    const auto res = test::to_host<uint16_t>(ar_res[k], ar_elems * n_ar);
    const auto out = test::to_host<uint16_t>(ar_out[k], ar_elems * n_ar);
    const auto ctx = test::to_host<uint32_t>(ctx_out[k], ar_elems / 2 * n_ctx);
    const auto logits = test::to_host<uint32_t>(logit_out[k], logit_elems / 2 * n_logit);
    long bad = 0;
    for (int i = 0; i < n_ar; ++i) {
      const reference::ArNormResult& ref = ar_ref[static_cast<std::size_t>(ar_set[i])];
      bad += !std::equal(ref.residual_out.begin(), ref.residual_out.end(), res.begin() + ar_elems * i);
      for (std::size_t e = 0; e < ar_elems; ++e) bad += bf16::ulp_distance(out[ar_elems * i + e], ref.out[e]) > 1;
    }
    for (int i = 0; i < n_ctx; ++i) {
      const auto& ref = ctx_ref[static_cast<std::size_t>(ctx_set[i])];
      bad += !std::equal(ref.begin(), ref.end(), ctx.begin() + ar_elems / 2 * i);
    }
    for (int i = 0; i < n_logit; ++i) {
      const auto& ref = logit_ref[static_cast<std::size_t>(logit_set[i])];
      bad += !std::equal(ref.begin(), ref.end(), logits.begin() + logit_elems / 2 * i);
    }
    EXPECT_EQ(bad, 0) << "rank " << k << ": mismatching calls or elements over " << calls << " calls";
  }
}

}  // namespace
}  // namespace tpdecode
