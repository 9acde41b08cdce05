// ArNorm on the local team: the new residual bitwise equal to the CPU reference,
// the normalised output within 1 BF16 ulp (exact-match rate recorded), identical on
// every rank; co-residency refusal; graph replay; timeout and reset.
#include <gtest/gtest.h>

#include <string>

#include "gpu/comm_test_util.hpp"
#include "tpdecode/all_reduce.hpp"
#include "tpdecode/ar_norm.hpp"
#include "tpdecode/local_team.hpp"

namespace tpdecode {
namespace {

using test::ArNormCase;

void launch_all_ranks(const Team& team, const Mailbox& box, const ArNormCase& c, int parity) {
  for (int i = 0; i < team.driven(); ++i) ar_norm(team.rank_context(i), box.view(i, parity), c.io(i));
}

void expect_matches_reference(const ArNormCase& c, long& exact, long& total) {
  const test::ArNormCheck r = test::check_ar_norm(c);
  EXPECT_EQ(r.residual_mismatches, 0) << "new residual differs from the reference";
  EXPECT_EQ(r.out_over_one_ulp, 0) << "normalised output more than 1 ulp from the reference";
  EXPECT_EQ(r.ranks_differing, 0) << "ranks disagree";
  exact += r.out_exact;
  total += r.out_total;
}

void record_exact_rate(long exact, long total) {
  const double rate = total ? static_cast<double>(exact) / static_cast<double>(total) : 0.0;
  testing::Test::RecordProperty("normed_exact_rate", std::to_string(rate));
  std::printf("ArNorm normalised output: %ld of %ld elements bitwise equal to the reference (%.6f)\n", exact, total,
              rate);
}

TEST(ArNorm, BitwiseResidualAgainstReferenceEveryRankAndShape) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  long exact = 0, total = 0;
  const std::vector<int> team_sizes = test::quick() ? std::vector<int>{2, 8} : std::vector<int>{2, 4, 8};
  const std::vector<int> hiddens = test::quick() ? std::vector<int>{7168} : std::vector<int>{7168, 4096};
  for (int ranks : team_sizes) {
    LocalTeam team(ranks);
    for (int hidden : hiddens) {
      Mailbox box(team, all_reduce_mailbox_shape(ranks, 64, hidden));
      const int fits = ar_norm_max_resident_rows(team.rank_context(0), hidden);
      const int step = test::quick() ? 16 : 7;
      for (int rows = 1; rows <= 64; rows += (rows < 8 ? 1 : step)) {
        SCOPED_TRACE(testing::Message() << "TP " << ranks << " H " << hidden << " rows " << rows);
        const ArNormCase c = test::make_ar_norm_case(ranks, rows, hidden, rows % 3 != 0, rng);
        if (rows > fits) {
          EXPECT_THROW(launch_all_ranks(team, box, c, rows % 2), CapacityError);
          continue;
        }
        launch_all_ranks(team, box, c, rows % 2);
        team.synchronize();
        team.check_errors();
        expect_matches_reference(c, exact, total);
      }
    }
  }
  record_exact_rate(exact, total);
}

TEST(ArNorm, BitwiseEverySupportedHiddenSize) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  LocalTeam team(2);
  long exact = 0, total = 0;
  for (int hidden : {4096, 5120, 7168, 8192}) {
    SCOPED_TRACE(testing::Message() << "H " << hidden);
    Mailbox box(team, all_reduce_mailbox_shape(2, 8, hidden));
    for (int parity : {0, 1}) {
      const ArNormCase c = test::make_ar_norm_case(2, 5, hidden, parity == 0, rng);
      launch_all_ranks(team, box, c, parity);
      team.synchronize();
      team.check_errors();
      expect_matches_reference(c, exact, total);
    }
  }
  record_exact_rate(exact, total);
}

TEST(ArNorm, RefusesRowsOneGpuCannotHoldAtTp8) {
  TPD_REQUIRE_GPU();
  LocalTeam team(8);
  const int fits = ar_norm_max_resident_rows(team.rank_context(0), 7168);
  ASSERT_GE(fits, 1);
  ASSERT_LT(fits, 64) << "one GPU should not hold 8 ranks x 64 rows of 8-CTA clusters";
  Mailbox box(team, all_reduce_mailbox_shape(8, 64, 7168));
  std::mt19937_64 rng(test::fresh_seed());
  const ArNormCase c = test::make_ar_norm_case(8, fits + 1, 7168, true, rng);
  try {
    launch_all_ranks(team, box, c, 0);
    FAIL() << fits + 1 << " rows at TP 8 on one GPU were accepted";
  } catch (const CapacityError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot all be resident"), std::string::npos) << e.what();
  }
  team.synchronize();
  team.check_errors();
  std::printf("ArNorm at TP 8 on one GPU holds %d rows per call\n", fits);
}

TEST(ArNorm, GraphCaptureAndReplay) {
  TPD_REQUIRE_GPU();
  constexpr int kRanks = 8, kRows = 4, kHidden = 7168, kCallsPerGraph = 6;
  LocalTeam team(kRanks);
  Mailbox box(team, all_reduce_mailbox_shape(kRanks, 64, kHidden));
  std::mt19937_64 rng(test::fresh_seed());
  ArNormCase c = test::make_ar_norm_case(kRanks, kRows, kHidden, true, rng);
  test::TeamGraph graph(team, [&] {
    for (int call = 0; call < kCallsPerGraph; ++call) launch_all_ranks(team, box, c, call % 2);
  });
  long exact = 0, total = 0;
  for (int replay = 0; replay < 20; ++replay) {
    const ArNormCase fresh = test::make_ar_norm_case(kRanks, kRows, kHidden, true, rng);
    c.x_host = fresh.x_host;
    c.residual_host = fresh.residual_host;
    for (int k = 0; k < kRanks; ++k) {
      test::upload(c.x[k], c.x_host[k].data(), c.x_host[k].size() * 2);
      test::upload(c.res[k], c.residual_host.data(), c.residual_host.size() * 2);
      test::poison(c.out[k]);
      test::poison(c.res_out[k]);
    }
    TPD_CUDA(cudaDeviceSynchronize());
    graph.replay();
    team.check_errors();
    expect_matches_reference(c, exact, total);
  }
}

TEST(ArNorm, AbsentRankTimesOutThenResetRecovers) {
  TPD_REQUIRE_GPU();
  constexpr int kRanks = 4, kRows = 3, kHidden = 4096;
  TeamOptions options;
  options.timeout_ms = 200;
  LocalTeam team(kRanks, 0, options);
  Mailbox box(team, all_reduce_mailbox_shape(kRanks, 8, kHidden));
  std::mt19937_64 rng(test::fresh_seed());
  const ArNormCase c = test::make_ar_norm_case(kRanks, kRows, kHidden, true, rng);
  test::expect_absent_rank_times_out(
      team, kRanks - 1, [&](int i) { ar_norm(team.rank_context(i), box.view(i, 1), c.io(i)); }, "ar_norm");
  EXPECT_THROW(launch_all_ranks(team, box, c, 0), TimeoutError);
  team.reset();
  long exact = 0, total = 0;
  for (int parity : {1, 0, 1}) {
    const ArNormCase fresh = test::make_ar_norm_case(kRanks, kRows, kHidden, parity == 1, rng);
    launch_all_ranks(team, box, fresh, parity);
    team.synchronize();
    team.check_errors();
    expect_matches_reference(fresh, exact, total);
  }
}

}  // namespace
}  // namespace tpdecode
