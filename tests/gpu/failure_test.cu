// Failing together: a rank delayed past the deadline by a spin kernel. Every rank
// raises a TimeoutError (naming rank, op, parity and slot) within the deadline of
// its stream draining, no output is silently wrong (each is the reference or all
// NaN), queued calls, stock collectives and replayed graphs after the failure do
// nothing wrong, nothing hangs, and reset() on every rank makes the team correct
// again. Runs on a local team of 4 and, with 2 GPUs or more, on the NCCL team.
#include <gtest/gtest.h>

#include <chrono>

#include "gpu/comm_cases.hpp"
#include "gpu/gpu_test_util.hpp"
#include "tpdecode/comm.hpp"
#include "tpdecode/local_team.hpp"
#include "tpdecode/nccl_team.hpp"

namespace tpdecode {
namespace {

using Clock = std::chrono::steady_clock;
using test::AllReduceCase;
using test::ArNormCase;
using test::team_streams;

constexpr uint64_t kTimeoutMs = 200;
constexpr double kLateMs = 2.5 * kTimeoutMs;

TeamOptions short_deadline() {
  TeamOptions o;
  o.timeout_ms = kTimeoutMs;
  return o;
}

// Runs `body` on local teams of 4 and 8 and on the NCCL team when there is one.
void on_teams(const std::function<void(Team&)>& body) {
  for (int tp : {4, 8}) {
    SCOPED_TRACE(testing::Message() << "local team TP " << tp);
    LocalTeam team(tp, 0, short_deadline());
    body(team);
  }
  const std::vector<int> devices = test::nccl_team_devices();
  std::string why;
  if (devices.size() < 2 || !nccl_team_available(&why)) return;
  SCOPED_TRACE("NCCL team");
  NcclTeam::run_threads(devices, body, short_deadline());
}

// The one-shot mailboxes of the tests' calls (whatever the crossover table says).
CommConfig one_shot_config() {
  CommConfig cc;
  cc.hidden = 4096;
  cc.rows_cap = 8;
  cc.algorithm = CommAlgorithm::kOneShot;
  return cc;
}

// The driven ranks' outputs: each is the reference or entirely NaN (poisoned).
int silently_wrong(const Team& team, const AllReduceCase& c) {
  int bad = 0;
  for (int i = 0; i < team.driven(); ++i) {
    const auto& out = c.out[static_cast<std::size_t>(i)];
    if (test::to_host<uint16_t>(out, c.reference.size()) != c.reference && !test::all_nan(out, c.reference.size())) ++bad;
  }
  return bad;
}

// Delays the team's last rank past the deadline before whatever `enqueue` queues.
void delay_last_rank(Team& team) {
  for (int i = 0; i < team.driven(); ++i)
    if (team.rank(i) == team.size() - 1) test::spin(team.stream(i), kLateMs);
}

// synchronize() raises TimeoutError naming the op, within the late rank's delay
// plus the deadline and a margin; returns the message.
std::string expect_timeout(Team& team) {
  const auto start = Clock::now();
  std::string what;
  try {
    team.synchronize();
    ADD_FAILURE() << "rank " << team.rank() << ": no error was raised";
  } catch (const TimeoutError& e) {
    what = e.what();
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  EXPECT_LT(ms, kLateMs + kTimeoutMs + 1000) << "rank " << team.rank() << " learned of the failure too late";
  EXPECT_TRUE(team.has_error() || what.find("aborted the team") != std::string::npos) << what;
  return what;
}

// The driven ranks' ArNorm outputs: each new residual is the reference, or the
// output is entirely NaN (poisoned).
int silently_wrong(const Team& team, const ArNormCase& c) {
  int bad = 0;
  for (int i = 0; i < team.driven(); ++i) {
    const auto k = static_cast<std::size_t>(i);
    const std::size_t n = c.reference.out.size();
    const bool right = test::to_host<uint16_t>(c.res_out[k], n) == c.reference.residual_out;
    if (!right && !test::all_nan(c.out[k], n)) ++bad;
  }
  return bad;
}

// After reset() on every rank, fresh calls on both parities are bitwise right (and
// take `path`).
void expect_recovered(Team& team, TpComm& comm, uint64_t seed, CommPath path = CommPath::kOneShot) {
  team.reset();
  EXPECT_FALSE(team.has_error());
  for (int call = 0; call < 3; ++call) {
    AllReduceCase a(team, 3, 4096, seed + 100u + static_cast<uint64_t>(call));
    EXPECT_EQ(comm.all_reduce(a.io, team_streams(team)).path, path);
    team.synchronize();
    EXPECT_EQ(a.ranks_wrong(team), 0) << "after reset, call " << call;
  }
}

TEST(Failure, LateRankTimesOutNamingRankOpParitySlotThenResetRecovers) {
  TPD_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  on_teams([&](Team& team) {
    TpComm comm(team, one_shot_config());
    AllReduceCase a(team, 3, 4096, seed);
    delay_last_rank(team);
    comm.all_reduce(a.io, team_streams(team));
    const std::string what = expect_timeout(team);
    // The first record of a driven rank: its own timeout, naming the late rank's
    // slot, or (having seen a peer's abort first) that peer.
    const bool timed_out =
        what.find("timed out in all_reduce (parity 0): slot " + std::to_string(team.size() - 1)) != std::string::npos;
    EXPECT_TRUE(timed_out || what.find("aborted the team") != std::string::npos) << what;
    EXPECT_EQ(silently_wrong(team, a), 0);
    // Until reset() the team refuses new calls.
    EXPECT_THROW(comm.all_reduce(a.io, team_streams(team)), TimeoutError);
    expect_recovered(team, comm, seed);
  });
}

TEST(Failure, QueuedCallsAndAStockCollectiveAfterALateRank) {
  TPD_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  on_teams([&](Team& team) {
    TpComm comm(team, one_shot_config());
    const std::vector<cudaStream_t> streams = team_streams(team);
    std::vector<AllReduceCase> calls;
    for (int c = 0; c < 4; ++c) calls.emplace_back(team, 2, 4096, seed + static_cast<uint64_t>(c));
    ArNormCase norm(team, 2, 4096, true, seed + 10);
    AllReduceCase stock(team, 2, 4096, seed + 20);
    delay_last_rank(team);
    for (AllReduceCase& c : calls) comm.all_reduce(c.io, streams);  // queued behind the late rank
    comm.ar_norm(norm.io, streams);
    comm.set_algorithm(CommAlgorithm::kStock);
    EXPECT_EQ(comm.all_reduce(stock.io, streams).path, CommPath::kStock);
    comm.set_algorithm(CommAlgorithm::kOneShot);
    expect_timeout(team);
    for (const AllReduceCase& c : calls) EXPECT_EQ(silently_wrong(team, c), 0);
    // The stock collective ran on the same inputs on every rank: it is right.
    EXPECT_EQ(stock.ranks_wrong(team), 0);
    EXPECT_EQ(silently_wrong(team, norm), 0) << "ar_norm output neither right nor poisoned";
    expect_recovered(team, comm, seed);
  });
}

TEST(Failure, ReplayedGraphAfterALateRankOnlyReportsThenWorksAfterReset) {
  TPD_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  on_teams([&](Team& team) {
    TpComm comm(team, one_shot_config());
    const std::vector<cudaStream_t> streams = team_streams(team);
    AllReduceCase a(team, 2, 4096, seed);
    AllReduceCase b(team, 3, 4096, seed + 1);
    // The late rank's delay is a node of the graph (0 ns until the failing replays).
    const DeviceBuffer delay_ns = test::to_device(std::vector<uint64_t>{0});
    test::TeamGraph graph(team, [&] {
      for (int i = 0; i < team.driven(); ++i)
        if (team.rank(i) == team.size() - 1) test::spin_by(streams[static_cast<std::size_t>(i)], delay_ns.as<uint64_t>());
      comm.all_reduce(a.io, streams);
      comm.all_reduce(b.io, streams);
      comm.all_reduce(a.io, streams);
    });
    graph.replay(5);
    EXPECT_EQ(a.ranks_wrong(team) + b.ranks_wrong(team), 0) << "before the failure";
    a.refill(team, seed + 2);
    b.refill(team, seed + 3);
    const uint64_t late_ns = static_cast<uint64_t>(kLateMs * 1e6);
    TPD_CUDA(cudaMemcpy(delay_ns.get(), &late_ns, sizeof late_ns, cudaMemcpyHostToDevice));
    graph.replay(2);  // every call after the failure must do nothing but report
    expect_timeout(team);
    EXPECT_EQ(silently_wrong(team, a) + silently_wrong(team, b), 0);
    TPD_CUDA(cudaMemset(delay_ns.get(), 0, sizeof(uint64_t)));
    team.reset();
    a.refill(team, seed + 4);
    b.refill(team, seed + 5);
    graph.replay(7);
    team.synchronize();
    EXPECT_EQ(a.ranks_wrong(team) + b.ranks_wrong(team), 0) << "graph after reset";
  });
}

// The two-shot: a late rank is absent both as a pusher and as the owner of its
// columns, so a driven rank's first record is its own timeout in the owners' reduce
// or in the gather, naming the late rank's slot and the parity, or (having seen a
// peer's abort first) that peer. Every output is right or NaN (the ArNorm queued
// behind: whole rows NaN), and reset() makes the two-shot right again.
TEST(Failure, TwoShotLateRankTimesOutNamingOpParitySlotThenResetRecovers) {
  TPD_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  on_teams([&](Team& team) {
    TpComm comm(team, CommConfig{.hidden = 4096, .rows_cap = 8, .algorithm = CommAlgorithm::kTwoShot});
    const std::vector<cudaStream_t> streams = team_streams(team);
    AllReduceCase a(team, 3, 4096, seed);
    ArNormCase norm(team, 2, 4096, true, seed + 1);
    delay_last_rank(team);
    EXPECT_EQ(comm.all_reduce(a.io, streams).path, CommPath::kTwoShot);
    EXPECT_EQ(comm.ar_norm(norm.io, streams).path, CommPath::kTwoShot);
    const std::string what = expect_timeout(team);
    const std::string slot = "(parity 0): slot " + std::to_string(team.size() - 1);
    const bool timed_out =
        what.find("timed out in two_shot") != std::string::npos && what.find(slot) != std::string::npos;
    EXPECT_TRUE(timed_out || what.find("aborted the team") != std::string::npos) << what;
    EXPECT_EQ(silently_wrong(team, a), 0);
    EXPECT_EQ(silently_wrong(team, norm), 0);
    EXPECT_THROW(comm.all_reduce(a.io, streams), TimeoutError);
    expect_recovered(team, comm, seed, CommPath::kTwoShot);
  });
}

// synchronize() and reset() wait for the caller's streams they are given (the team
// does not see them), within their limit: a stream still busy past it is reported
// (on a local team as TeamBroken, on the NCCL team after aborting its communicator,
// which is then broken() for good).
TEST(Failure, SynchronizeAndResetWaitForTheCallersStreams) {
  TPD_REQUIRE_GPU();
  LocalTeam team(2, 0, short_deadline());
  cudaStream_t mine = nullptr;
  TPD_CUDA(cudaSetDevice(team.device()));
  TPD_CUDA(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking));
  const std::span<const cudaStream_t> also(&mine, 1);
  test::spin(mine, 200);
  team.synchronize(std::chrono::milliseconds(0), also);
  EXPECT_EQ(cudaStreamQuery(mine), cudaSuccess);
  test::spin(mine, 200);
  team.reset(also);
  EXPECT_EQ(cudaStreamQuery(mine), cudaSuccess);
  test::spin(mine, 3000);
  EXPECT_THROW(team.synchronize(std::chrono::milliseconds(300), also), TeamBroken);  // a local team's stuck stream
  TPD_CUDA(cudaStreamSynchronize(mine));
  // A local team is not broken for good: once the work drained, reset() and calls work.
  EXPECT_FALSE(team.broken());
  team.reset(also);
  team.check_errors();
  TPD_CUDA(cudaStreamDestroy(mine));
}

}  // namespace
}  // namespace tpdecode
