// The one-shot all-reduce on the local team: bitwise against the CPU reference,
// identical on every rank, parity reuse over thousands of calls, graph replay,
// co-residency refusal, timeout and reset.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <vector>

#include "gpu/gpu_test_util.hpp"
#include "tpdecode/all_reduce.hpp"
#include "tpdecode/local_team.hpp"
#include "reference/all_reduce.hpp"

namespace tpdecode {
namespace {

using test::DeviceBuffer;

bool quick() { return std::getenv("TPDECODE_QUICK") != nullptr; }

// Per-rank inputs and outputs of one call shape.
struct Rows {
  int rows, hidden;
  std::vector<std::vector<uint16_t>> host;  // [rank][rows * hidden]
  std::vector<DeviceBuffer> x, out;
};

Rows make_rows(int ranks, int rows, int hidden, std::mt19937_64& rng) {
  Rows r{rows, hidden, {}, {}, {}};
  for (int k = 0; k < ranks; ++k) {
    r.host.push_back(test::random_bf16(static_cast<std::size_t>(rows) * hidden, rng));
    // Plant sentinel words (BF16 pair +0, -0): they must arrive as +0, +0.
    std::uniform_int_distribution<int> pick(0, rows * hidden / 2 - 1);
    for (int n = 0; n < 3; ++n) {
      const int w = pick(rng);
      r.host.back()[2 * w] = 0x0000;
      r.host.back()[2 * w + 1] = 0x8000;
    }
    r.x.push_back(test::to_device(r.host.back()));
    r.out.emplace_back(static_cast<std::size_t>(rows) * hidden * 2);
    test::poison(r.out.back());
  }
  return r;
}

void launch_all_ranks(const Team& team, const Mailbox& box, Rows& r, int parity) {
  for (int i = 0; i < team.driven(); ++i)
    all_reduce(team.rank_context(i), box.view(i, parity), TensorView::bf16(r.x[i].get(), r.rows, r.hidden),
               TensorView::bf16(r.out[i].get(), r.rows, r.hidden));
}

void expect_reference(Rows& r, const char* what) {
  const std::vector<uint16_t> ref = reference::all_reduce(r.host);
  for (std::size_t k = 0; k < r.out.size(); ++k) {
    const std::vector<uint16_t> got = test::to_host<uint16_t>(r.out[k], ref.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) bad += got[i] != ref[i];
    ASSERT_EQ(bad, 0u) << what << ": rank " << k << " differs from the reference in " << bad << " of " << ref.size();
  }
}

TEST(AllReduce, BitwiseAgainstReferenceEveryRankAndShape) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  for (int ranks : {2, 4, 8}) {
    LocalTeam team(ranks);
    for (int hidden : {7168, 4096}) {
      Mailbox box(team, all_reduce_mailbox_shape(ranks, 64, hidden));
      const int fits = all_reduce_max_rows(team.rank_context(0), hidden);
      ASSERT_GE(fits, ranks == 8 ? 16 : 32) << "TP " << ranks << " H " << hidden;
      for (int rows = 1; rows <= 64; rows += (rows < 8 ? 1 : 7)) {
        SCOPED_TRACE(testing::Message() << "TP " << ranks << " H " << hidden << " rows " << rows);
        Rows r = make_rows(ranks, rows, hidden, rng);
        if (rows > fits) {
          EXPECT_THROW(launch_all_ranks(team, box, r, rows % 2), CapacityError);
          continue;
        }
        launch_all_ranks(team, box, r, rows % 2);
        team.synchronize();
        team.check_errors();
        expect_reference(r, "one call");
      }
    }
  }
}

TEST(AllReduce, RefusesWhatOneGpuCannotHoldAtTp8) {
  TPD_REQUIRE_GPU();
  LocalTeam team(8);
  Mailbox box(team, all_reduce_mailbox_shape(8, 64, 7168));
  std::mt19937_64 rng(test::fresh_seed());
  Rows r = make_rows(8, 64, 7168, rng);
  try {
    launch_all_ranks(team, box, r, 0);
    FAIL() << "64 rows at TP 8 on one GPU were accepted";
  } catch (const CapacityError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot all be resident"), std::string::npos) << e.what();
  }
  team.synchronize();  // nothing was launched: no rank waits
  team.check_errors();
}

TEST(AllReduce, BackToBackCallsAlternatingParity) {
  TPD_REQUIRE_GPU();
  const int calls = quick() ? 200 : 10000;
  constexpr int kRanks = 4, kRows = 2, kHidden = 1024, kSets = 16;
  LocalTeam team(kRanks);
  Mailbox box(team, all_reduce_mailbox_shape(kRanks, 8, kHidden));
  std::mt19937_64 rng(test::fresh_seed());
  std::vector<Rows> sets;
  for (int s = 0; s < kSets; ++s) sets.push_back(make_rows(kRanks, kRows, kHidden, rng));
  // Every call's output is kept: out[call] must equal the reference of its set.
  const std::size_t row_elems = static_cast<std::size_t>(kRows) * kHidden;
  std::vector<DeviceBuffer> outs;
  for (int k = 0; k < kRanks; ++k) {
    outs.emplace_back(row_elems * 2 * calls);
    test::poison(outs.back());
  }
  for (int c = 0; c < calls; ++c) {
    Rows& r = sets[static_cast<std::size_t>(c % kSets)];
    for (int i = 0; i < kRanks; ++i)
      all_reduce(team.rank_context(i), box.view(i, c % 2), TensorView::bf16(r.x[i].get(), kRows, kHidden),
                 TensorView::bf16(outs[i].as<uint16_t>() + row_elems * c, kRows, kHidden));
  }
  team.synchronize();
  team.check_errors();
  std::vector<std::vector<uint16_t>> refs;
  for (Rows& r : sets) refs.push_back(reference::all_reduce(r.host));
  for (int k = 0; k < kRanks; ++k) {
    const std::vector<uint16_t> got = test::to_host<uint16_t>(outs[k], row_elems * calls);
    long bad_calls = 0;
    for (int c = 0; c < calls; ++c) {
      const std::vector<uint16_t>& ref = refs[static_cast<std::size_t>(c % kSets)];
      if (!std::equal(ref.begin(), ref.end(), got.begin() + static_cast<long>(row_elems) * c)) ++bad_calls;
    }
    EXPECT_EQ(bad_calls, 0) << "rank " << k << ": calls differing from the reference";
  }
}

TEST(AllReduce, GraphCaptureAndReplay) {
  TPD_REQUIRE_GPU();
  constexpr int kRanks = 8, kRows = 4, kHidden = 7168, kCallsPerGraph = 6;
  LocalTeam team(kRanks);
  Mailbox box(team, all_reduce_mailbox_shape(kRanks, 64, kHidden));
  std::mt19937_64 rng(test::fresh_seed());
  Rows r = make_rows(kRanks, kRows, kHidden, rng);
  test::TeamGraph graph(team, [&] {
    for (int c = 0; c < kCallsPerGraph; ++c) launch_all_ranks(team, box, r, c % 2);
  });
  for (int replay = 0; replay < 20; ++replay) {
    // Fresh data each replay, written into the captured input buffers.
    for (int k = 0; k < kRanks; ++k) {
      r.host[k] = test::random_bf16(static_cast<std::size_t>(kRows) * kHidden, rng, 1.0f + replay);
      test::upload(r.x[k], r.host[k].data(), r.host[k].size() * 2);
      test::poison(r.out[k]);
    }
    TPD_CUDA(cudaDeviceSynchronize());
    graph.replay();
    team.check_errors();
    expect_reference(r, "graph replay");
  }
}

TEST(AllReduce, AbsentRankTimesOutThenResetRecovers) {
  TPD_REQUIRE_GPU();
  constexpr int kRanks = 4, kRows = 3, kHidden = 4096;
  TeamOptions options;
  options.timeout_ms = 200;
  LocalTeam team(kRanks, 0, options);
  Mailbox box(team, all_reduce_mailbox_shape(kRanks, 8, kHidden));
  std::mt19937_64 rng(test::fresh_seed());
  Rows r = make_rows(kRanks, kRows, kHidden, rng);
  test::expect_absent_rank_times_out(
      team, kRanks - 1,
      [&](int i) {
        all_reduce(team.rank_context(i), box.view(i, 0), TensorView::bf16(r.x[i].get(), kRows, kHidden),
                   TensorView::bf16(r.out[i].get(), kRows, kHidden));
      },
      "all_reduce");
  // A further call is refused until reset().
  EXPECT_THROW(launch_all_ranks(team, box, r, 1), TimeoutError);
  team.reset();
  EXPECT_FALSE(team.has_error());
  for (int parity : {0, 1, 0}) {
    Rows fresh = make_rows(kRanks, kRows, kHidden, rng);
    launch_all_ranks(team, box, fresh, parity);
    team.synchronize();
    team.check_errors();
    expect_reference(fresh, "after reset");
  }
}

}  // namespace
}  // namespace tpdecode
