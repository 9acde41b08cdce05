// The calls one collective runs as (rules.hpp: plan_all_reduce, plan_gather): one
// call by default, and in batch-invariant mode rows beyond what the mailbox paths
// hold as further mailbox calls, stock calls only where no mailbox path serves.
#include <gtest/gtest.h>

#include <string>

#include "comm/rules.hpp"
#include "cpu/comm_limits.hpp"

namespace tpdecode {
namespace {

using test::tp8_limits;
using test::with_two_shot;

CommLimits invariant(CommLimits l) {
  l.batch_invariant = true;
  return l;
}

// The calls' (rows, path) in order.
std::vector<std::pair<int64_t, CommPath>> calls_of(const CommPlan& p) {
  std::vector<std::pair<int64_t, CommPath>> v;
  int64_t next = 0;
  for (const CommCall& c : p.calls) {
    EXPECT_EQ(c.first, next) << "calls cover the rows in order";
    next += c.rows;
    v.emplace_back(c.rows, c.path);
  }
  return v;
}

using Calls = std::vector<std::pair<int64_t, CommPath>>;
constexpr CommPath k1 = CommPath::kOneShot, k2 = CommPath::kTwoShot, kS = CommPath::kStock;

TEST(CommPlan, DefaultModeIsOneCallWhateverTheRows) {
  const CommLimits l = with_two_shot(tp8_limits(), true);
  EXPECT_EQ(calls_of(plan_all_reduce(l, CommAlgorithm::kAuto, 40, 7168, true)), (Calls{{40, kS}}));
  EXPECT_EQ(calls_of(plan_all_reduce(l, CommAlgorithm::kAuto, 100, 7168, false)), (Calls{{100, kS}}));
  EXPECT_EQ(calls_of(plan_gather(l, CommAlgorithm::kAuto, 100, 1792, DType::kBF16)), (Calls{{100, kS}}));
}

TEST(CommPlan, InvariantModeRunsRowsBeyondTheMailboxesAsFurtherMailboxCalls) {
  const CommLimits l = invariant(with_two_shot(tp8_limits(), true));  // one-shot 21, ArNorm 7, two-shot 64
  // Where the default mode runs stock because the one-shot no longer holds the rows.
  EXPECT_EQ(calls_of(plan_all_reduce(l, CommAlgorithm::kAuto, 40, 7168, true)), (Calls{{40, k2}}));
  const CommPlan big = plan_all_reduce(l, CommAlgorithm::kAuto, 150, 7168, true);
  EXPECT_EQ(calls_of(big), (Calls{{64, k2}, {64, k2}, {22, k2}}));
  EXPECT_NE(big.result.why.find("150 rows as 3 calls of at most 64 rows"), std::string::npos) << big.result.why;
  EXPECT_EQ(big.result.path, k2);
  // Forced one-shot: calls of what it holds.
  EXPECT_EQ(calls_of(plan_all_reduce(l, CommAlgorithm::kOneShot, 20, 7168, true)), (Calls{{7, k1}, {7, k1}, {6, k1}}));
  EXPECT_EQ(calls_of(plan_all_reduce(l, CommAlgorithm::kOneShot, 30, 7168, false)), (Calls{{21, k1}, {9, k1}}));
  // A width the two-shot does not take (not 8 · TP columns): calls of the one-shot's rows.
  CommLimits wide = l;
  wide.hidden = 8192;
  EXPECT_EQ(calls_of(plan_all_reduce(wide, CommAlgorithm::kAuto, 30, 7168 + 8, false)), (Calls{{21, k1}, {9, k1}}));
  // Within what the mailboxes hold: one call, as by default.
  EXPECT_EQ(calls_of(plan_all_reduce(l, CommAlgorithm::kAuto, 5, 7168, true)), (Calls{{5, k1}}));
}

TEST(CommPlan, InvariantModeRunsStockOnlyWhereNoMailboxPathServesInCallsOfRowsCap) {
  CommLimits one = invariant(with_two_shot(tp8_limits(), true));
  one.team_size = 1;
  EXPECT_EQ(calls_of(plan_all_reduce(one, CommAlgorithm::kAuto, 100, 7168, true)), (Calls{{64, kS}, {36, kS}}));
  CommLimits apart = invariant(with_two_shot(tp8_limits(), false));
  apart.shares_memory = false;
  EXPECT_EQ(calls_of(plan_all_reduce(apart, CommAlgorithm::kAuto, 64, 7168, false)), (Calls{{64, kS}}));
  EXPECT_EQ(calls_of(plan_all_reduce(apart, CommAlgorithm::kAuto, 65, 7168, false)), (Calls{{64, kS}, {1, kS}}));
  const CommLimits l = invariant(with_two_shot(tp8_limits(), true));
  EXPECT_EQ(calls_of(plan_all_reduce(l, CommAlgorithm::kStock, 70, 7168, true)), (Calls{{64, kS}, {6, kS}}));
}

TEST(CommPlan, InvariantGathersChunkThroughTheMailboxAndI32RunsStock) {
  CommLimits l = invariant(with_two_shot(tp8_limits(), true));
  l.gather_rows = 30;
  EXPECT_EQ(calls_of(plan_gather(l, CommAlgorithm::kAuto, 70, 1792, DType::kBF16)),
            (Calls{{30, k1}, {30, k1}, {10, k1}}));
  EXPECT_EQ(calls_of(plan_gather(l, CommAlgorithm::kAuto, 70, 1792, DType::kI32)), (Calls{{64, kS}, {6, kS}}));
  EXPECT_EQ(calls_of(plan_gather(l, CommAlgorithm::kAuto, 20, 1792, DType::kF32)), (Calls{{20, k1}}));
}

}  // namespace
}  // namespace tpdecode
