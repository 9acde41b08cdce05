// Gather on the local team: bytes exact (planted sentinel words arrive as +0),
// every rank identical; in-place mode and re-arm; graph replay; timeout and reset.
#include <gtest/gtest.h>

#include <string>

#include "gpu/comm_test_util.hpp"
#include "tpdecode/gather.hpp"
#include "tpdecode/local_team.hpp"
#include "reference/gather.hpp"

namespace tpdecode {
namespace {

using test::DeviceBuffer;

struct GatherCase {
  int ranks, rows, words;  // words per shard row
  std::vector<std::vector<uint32_t>> host;
  std::vector<DeviceBuffer> shard, out;
};

GatherCase make_case(int ranks, int rows, int words, std::mt19937_64& rng) {
  GatherCase c{ranks, rows, words, {}, {}, {}};
  for (int k = 0; k < ranks; ++k) {
    c.host.push_back(test::random_words(static_cast<std::size_t>(rows) * words, rng));
    c.shard.push_back(test::to_device(c.host.back()));
    c.out.emplace_back(static_cast<std::size_t>(rows) * words * ranks * 4);
    test::poison(c.out.back());
  }
  return c;
}

TensorView words_view(const DeviceBuffer& b, int64_t rows, int64_t cols) {
  return TensorView{b.get(), DType::kI32, rows, cols, cols};
}

void launch_all_ranks(const Team& team, const Mailbox& box, const GatherCase& c, int parity, GatherMode mode) {
  for (int i = 0; i < team.driven(); ++i)
    gather(team.rank_context(i), box.view(i, parity), words_view(c.shard[i], c.rows, c.words),
           words_view(c.out[i], c.rows, static_cast<int64_t>(c.words) * c.ranks), mode);
}

long mismatched_ranks(const GatherCase& c) {
  const std::vector<uint32_t> ref = reference::gather(c.host, c.rows, c.words);
  long bad = 0;
  for (int k = 0; k < c.ranks; ++k) bad += test::to_host<uint32_t>(c.out[k], ref.size()) != ref;
  return bad;
}

TEST(Gather, BytesExactWithPlantedSentinelsEveryRankAndShape) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  const std::vector<int> team_sizes = test::quick() ? std::vector<int>{2, 8} : std::vector<int>{2, 4, 8};
  for (int ranks : team_sizes) {
    LocalTeam team(ranks);
    // The context projection's shard (7168 / TP bf16) and a logits shard (20480 bf16).
    for (int words : {7168 / ranks / 2, 10240}) {
      Mailbox box(team, gather_mailbox_shape(ranks, 64, static_cast<int64_t>(words) * 4));
      for (int rows = 1; rows <= 64; rows += (rows < 8 ? 1 : (test::quick() ? 28 : 7))) {
        SCOPED_TRACE(testing::Message() << "TP " << ranks << " shard words " << words << " rows " << rows);
        const GatherCase c = make_case(ranks, rows, words, rng);
        launch_all_ranks(team, box, c, rows % 2, GatherMode::kCopy);
        team.synchronize();
        team.check_errors();
        EXPECT_EQ(mismatched_ranks(c), 0);
      }
    }
  }
}

TEST(Gather, BytesInPlaceThenReaderRearms) {
  TPD_REQUIRE_GPU();
  constexpr int kRanks = 4, kRows = 5, kWords = 256;
  LocalTeam team(kRanks);
  Mailbox box(team, gather_mailbox_shape(kRanks, 8, kWords * 4));
  std::mt19937_64 rng(test::fresh_seed());
  for (int call = 0; call < 6; ++call) {
    const int parity = call % 2;
    const GatherCase c = make_case(kRanks, kRows, kWords, rng);
    launch_all_ranks(team, box, c, parity, GatherMode::kInPlace);
    team.synchronize();
    team.check_errors();
    const std::vector<uint32_t> ref = reference::gather(c.host, kRows, kWords);
    for (int i = 0; i < kRanks; ++i) {
      const Mailbox::View v = box.view(i, parity);
      std::vector<uint32_t> got(ref.size());
      const std::size_t row_bytes = static_cast<std::size_t>(kRanks) * kWords * 4;
      TPD_CUDA(cudaMemcpy2D(got.data(), row_bytes, gathered_rows(team.rank_context(i), v),
                            static_cast<std::size_t>(v.row_bytes), row_bytes, kRows, cudaMemcpyDeviceToHost));
      EXPECT_EQ(got, ref) << "rank " << i << " call " << call;
      gather_rearm(team.rank_context(i), v, kRows);
    }
  }
  team.synchronize();
}

TEST(Gather, GraphCaptureAndReplay) {
  TPD_REQUIRE_GPU();
  constexpr int kRanks = 8, kRows = 16, kWords = 448;
  LocalTeam team(kRanks);
  Mailbox box(team, gather_mailbox_shape(kRanks, 64, kWords * 4));
  std::mt19937_64 rng(test::fresh_seed());
  GatherCase c = make_case(kRanks, kRows, kWords, rng);
  test::TeamGraph graph(team, [&] {
    for (int call = 0; call < 4; ++call) launch_all_ranks(team, box, c, call % 2, GatherMode::kCopy);
  });
  for (int replay = 0; replay < 20; ++replay) {
    for (int k = 0; k < kRanks; ++k) {
      c.host[k] = test::random_words(c.host[k].size(), rng);
      test::upload(c.shard[k], c.host[k].data(), c.host[k].size() * 4);
      test::poison(c.out[k]);
    }
    TPD_CUDA(cudaDeviceSynchronize());
    graph.replay();
    team.check_errors();
    EXPECT_EQ(mismatched_ranks(c), 0) << "replay " << replay;
  }
}

TEST(Gather, AbsentRankTimesOutThenResetRecovers) {
  TPD_REQUIRE_GPU();
  constexpr int kRanks = 4, kRows = 2, kWords = 512;
  TeamOptions options;
  options.timeout_ms = 200;
  LocalTeam team(kRanks, 0, options);
  Mailbox box(team, gather_mailbox_shape(kRanks, 8, kWords * 4));
  std::mt19937_64 rng(test::fresh_seed());
  const GatherCase c = make_case(kRanks, kRows, kWords, rng);
  test::expect_absent_rank_times_out(
      team, 0,
      [&](int i) {
        gather(team.rank_context(i), box.view(i, 0), words_view(c.shard[i], kRows, kWords),
               words_view(c.out[i], kRows, kWords * kRanks), GatherMode::kCopy);
      },
      "gather");
  team.reset();
  for (int parity : {0, 1, 0}) {
    const GatherCase fresh = make_case(kRanks, kRows, kWords, rng);
    launch_all_ranks(team, box, fresh, parity, GatherMode::kCopy);
    team.synchronize();
    team.check_errors();
    EXPECT_EQ(mismatched_ranks(fresh), 0);
  }
}

}  // namespace
}  // namespace tpdecode
