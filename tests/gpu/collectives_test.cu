// TpComm's collectives on every team this machine has (local teams of 2, 4, 8 on
// one GPU; the NCCL team over NVLink when there are 2 GPUs or more): bitwise
// against the CPU reference on every rank, the path each call takes, hidden sizes
// of real models, back-to-back calls, and CUDA graphs of one step replayed back to
// back (device-side epochs).
#include <gtest/gtest.h>

#include "gpu/comm_cases.hpp"
#include "gpu/gpu_test_util.hpp"
#include "team/team_internals.hpp"
#include "tpdecode/comm.hpp"
#include "tpdecode/local_team.hpp"
#include "tpdecode/nccl_team.hpp"

namespace tpdecode {
namespace {

using test::AllReduceCase;
using test::ArNormCase;
using test::GatherCase;
using test::team_streams;

constexpr int kRowsCap = 64;

TEST(Collectives, AllReduceAndArNormBitwiseOnEveryRankRowCountAndPath) {
  TPD_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  test::for_each_team([&](Team& team) {
    CommConfig cc;
    cc.hidden = 7168;
    TpComm comm(team, cc);
    const std::vector<cudaStream_t> streams = team_streams(team);
    for (int rows = 1; rows <= kRowsCap; rows += rows < 8 ? 1 : 7) {
      SCOPED_TRACE(testing::Message() << "TP " << team.size() << " rows " << rows);
      AllReduceCase a(team, rows, 7168, seed + static_cast<uint64_t>(rows));
      const CommResult ra = comm.all_reduce(a.io, streams);
      team.synchronize();
      EXPECT_EQ(a.ranks_wrong(team), 0) << comm_path_name(ra.path) << " " << ra.why;
      ArNormCase n(team, rows, 7168, rows % 4 != 3, seed + 1000u + static_cast<uint64_t>(rows));
      const CommResult rn = comm.ar_norm(n.io, streams);
      team.synchronize();
      EXPECT_EQ(n.ranks_wrong(team), 0) << comm_path_name(rn.path) << " " << rn.why;
      // The automatic choice (rules.hpp, crossover.hpp): a mailbox path where one
      // serves and was measured faster, else stock, and a reason exactly then.
      EXPECT_EQ(rn.path == CommPath::kStock, !rn.why.empty());
      EXPECT_EQ(ra.path == CommPath::kStock, !ra.why.empty());
      if (rows <= 4) EXPECT_EQ(rn.path, CommPath::kOneShot) << rn.why;
    }
  });
}

TEST(Collectives, ArNormServesRealModelsHiddenSizes) {
  TPD_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  LocalTeam team(4);
  for (int64_t hidden : {2048, 3584, 4096, 5120, 6144, 8192, 12288, 16384}) {
    SCOPED_TRACE(testing::Message() << "hidden " << hidden);
    CommConfig cc;
    cc.hidden = hidden;
    cc.rows_cap = 8;
    cc.algorithm = CommAlgorithm::kOneShot;  // whatever the crossover table says
    TpComm comm(team, cc);
    for (int rows : {1, 3}) {
      ArNormCase n(team, rows, hidden, true, seed + static_cast<uint64_t>(hidden + rows));
      EXPECT_EQ(comm.ar_norm(n.io, team_streams(team)).path, CommPath::kOneShot);
      team.synchronize();
      EXPECT_EQ(n.ranks_wrong(team), 0);
      AllReduceCase a(team, rows, hidden, seed + 7u * static_cast<uint64_t>(hidden + rows));
      EXPECT_EQ(comm.all_reduce(a.io, team_streams(team)).path, CommPath::kOneShot);
      team.synchronize();
      EXPECT_EQ(a.ranks_wrong(team), 0);
    }
  }
}

// The TpComm a team keeps for the library's objects (team_internals.hpp): the same
// object for an equal config, another for another config.
TEST(Collectives, TheTeamKeepsOneSharedCommPerConfig) {
  TPD_REQUIRE_GPU();
  LocalTeam team(2);
  CommConfig a;
  a.hidden = 1024;
  a.rows_cap = 8;
  TpComm& first = shared_comm(team, a);
  EXPECT_EQ(&shared_comm(team, a), &first);
  CommConfig b = a;
  b.rows_cap = 16;
  TpComm& other = shared_comm(team, b);
  EXPECT_NE(&other, &first);
  EXPECT_EQ(other.config().rows_cap, 16);
  EXPECT_EQ(&shared_comm(team, a), &first);
  // Another group: another TpComm of the same config (users that may run at once).
  TpComm& apart = shared_comm(team, a, 1);
  EXPECT_NE(&apart, &first);
  EXPECT_EQ(&shared_comm(team, a, 1), &apart);
  EXPECT_EQ(&shared_comm(team, a, 0), &first);
  EXPECT_THROW(shared_comm(team, a, -1), InvalidArgument);
}

TEST(Collectives, StockPathGivesTheSameBitsOnTheLocalTeam) {
  TPD_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  LocalTeam team(8);
  CommConfig cc;
  cc.algorithm = CommAlgorithm::kStock;
  TpComm comm(team, cc);
  for (int rows : {1, 8, 64}) {
    ArNormCase n(team, rows, 7168, true, seed + static_cast<uint64_t>(rows));
    const CommResult r = comm.ar_norm(n.io, team_streams(team));
    EXPECT_EQ(r.path, CommPath::kStock);
    team.synchronize();
    EXPECT_EQ(n.ranks_wrong(team), 0) << "rows " << rows;
  }
}

TEST(Collectives, TpOneRunsTheNormAlone) {
  TPD_REQUIRE_GPU();
  LocalTeam team(1);
  TpComm comm(team);
  ArNormCase n(team, 5, 7168, true, test::fresh_seed());
  const CommResult r = comm.ar_norm(n.io, team_streams(team));
  EXPECT_EQ(r.path, CommPath::kStock);
  EXPECT_NE(r.why.find("TP 1"), std::string::npos) << r.why;
  team.synchronize();
  EXPECT_EQ(n.ranks_wrong(team), 0);
}

TEST(Collectives, GatherMovesBytesAndRefusesWhatTheSentinelWouldChange) {
  TPD_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  test::for_each_team([&](Team& team) {
    CommConfig cc;
    cc.gather_row_bytes = 20480 * 2 * team.size();
    TpComm comm(team, cc);
    const std::vector<cudaStream_t> streams = team_streams(team);
    for (int rows : {1, 7, 64}) {
      for (int64_t shard : {int64_t{7168} / team.size(), int64_t{20480}}) {
        GatherCase g(team, rows, shard, DType::kBF16, seed + static_cast<uint64_t>(rows * 131 + shard));
        const CommResult r = comm.gather(g.io, streams);
        team.synchronize();
        EXPECT_EQ(r.path, CommPath::kOneShot) << r.why;
        EXPECT_EQ(g.ranks_wrong(team, true), 0) << "rows " << rows << " shard " << shard;
      }
    }
    // F32: -0 (the sentinel word) arrives as +0 through the mailbox, as documented.
    GatherCase f(team, 3, 256, DType::kF32, seed + 1);
    EXPECT_EQ(comm.gather(f.io, streams).path, CommPath::kOneShot);
    team.synchronize();
    EXPECT_EQ(f.ranks_wrong(team, true), 0);
    // I32: INT_MIN is the sentinel word; the stock path carries it unchanged.
    GatherCase i(team, 3, 256, DType::kI32, seed + 2);
    const CommResult ri = comm.gather(i.io, streams);
    EXPECT_EQ(ri.path, CommPath::kStock);
    EXPECT_NE(ri.why.find("INT_MIN"), std::string::npos) << ri.why;
    team.synchronize();
    EXPECT_EQ(i.ranks_wrong(team, false), 0);
  });
}

TEST(Collectives, TenThousandBackToBackCallsOfMixedOps) {
  TPD_REQUIRE_GPU();
  const int calls = test::quick() ? 300 : 10000;
  const uint64_t seed = test::fresh_seed();
  test::for_each_team([&](Team& team) {
    if (team.kind() == TeamKind::kLocal && team.size() != 4) return;  // one local size is enough here
    CommConfig cc;
    cc.hidden = 1024;
    cc.rows_cap = 4;
    TpComm comm(team, cc);
    const std::vector<cudaStream_t> streams = team_streams(team);
    AllReduceCase a(team, 2, 1024, seed);
    ArNormCase n(team, 3, 1024, true, seed + 1);
    GatherCase g(team, 2, 512 / team.size() * 2, DType::kBF16, seed + 2);
    // Every call checks its output on the device against the reference, so a call
    // overwritten or read stale by its neighbours is counted.
    const DeviceBuffer want_a = test::to_device(a.reference);
    const DeviceBuffer want_n = test::to_device(n.reference.residual_out);
    const DeviceBuffer want_g = test::to_device(g.reference);
    DeviceBuffer mismatches(sizeof(unsigned));
    TPD_CUDA(cudaMemset(mismatches.get(), 0, sizeof(unsigned)));
    for (int c = 0; c < calls; ++c) {
      switch (c % 3) {
        case 0: comm.all_reduce(a.io, streams); break;
        case 1: comm.ar_norm(n.io, streams); break;
        default: comm.gather(g.io, streams); break;
      }
      for (int i = 0; i < team.driven(); ++i) {
        const auto k = static_cast<std::size_t>(i);
        if (c % 3 == 0) test::count_mismatches(a.out[k].get(), want_a.get(), a.reference.size(), mismatches.as<unsigned>(), streams[k]);
        if (c % 3 == 1) test::count_mismatches(n.res_out[k].get(), want_n.get(), n.reference.residual_out.size(), mismatches.as<unsigned>(), streams[k]);
        if (c % 3 == 2) test::count_mismatches(g.out[k].get(), want_g.get(), g.reference.size() * 2, mismatches.as<unsigned>(), streams[k]);
      }
    }
    team.synchronize();
    EXPECT_EQ(test::to_host<unsigned>(mismatches, 1)[0], 0u) << calls << " calls";
  });
}

// A graph of one drafter-like step: an odd number of calls on one mailbox
// (ar_norm, all_reduce, ar_norm) plus a gather. Replayed back to back, the calls of
// replay k+1 start on the other parity than replay k's: only device-side epochs
// make that reuse-safe. Every call's output is checked inside the graph.
TEST(Collectives, GraphOfOneStepReplayedBackToBack) {
  TPD_REQUIRE_GPU();
  const int replays = test::quick() ? 200 : 10000;
  const uint64_t seed = test::fresh_seed();
  test::for_each_team([&](Team& team) {
    if (team.kind() == TeamKind::kLocal && team.size() != 8) return;
    CommConfig cc;
    cc.hidden = 7168;
    cc.algorithm = CommAlgorithm::kOneShot;  // whatever the crossover table says
    TpComm comm(team, cc);
    const std::vector<cudaStream_t> streams = team_streams(team);
    ArNormCase n(team, 2, 7168, true, seed);
    AllReduceCase a(team, 2, 7168, seed + 1);
    GatherCase g(team, 2, 7168 / team.size(), DType::kBF16, seed + 2);
    const DeviceBuffer want_n = test::to_device(n.reference.residual_out);
    const DeviceBuffer want_a = test::to_device(a.reference);
    const DeviceBuffer want_g = test::to_device(g.reference);
    DeviceBuffer mismatches(sizeof(unsigned));
    TPD_CUDA(cudaMemset(mismatches.get(), 0, sizeof(unsigned)));
    const auto check = [&](const std::vector<DeviceBuffer>& got, const DeviceBuffer& want, std::size_t n16) {
      for (int i = 0; i < team.driven(); ++i)
        test::count_mismatches(got[static_cast<std::size_t>(i)].get(), want.get(), n16, mismatches.as<unsigned>(),
                               streams[static_cast<std::size_t>(i)]);
    };
    comm.ar_norm(n.io, streams);  // eager warm-up: the residual must not feed back, so it is read-only here
    team.synchronize();
    test::TeamGraph graph(team, [&] {
      EXPECT_EQ(comm.ar_norm(n.io, streams).path, CommPath::kOneShot);
      check(n.res_out, want_n, n.reference.residual_out.size());
      EXPECT_EQ(comm.all_reduce(a.io, streams).path, CommPath::kOneShot);
      check(a.out, want_a, a.reference.size());
      comm.ar_norm(n.io, streams);
      check(n.res_out, want_n, n.reference.residual_out.size());
      EXPECT_EQ(comm.gather(g.io, streams).path, CommPath::kOneShot);
      check(g.out, want_g, g.reference.size() * 2);
    });
    graph.replay(replays);
    team.synchronize();
    EXPECT_EQ(test::to_host<unsigned>(mismatches, 1)[0], 0u) << replays << " replays";
    // Fresh data through the same graph.
    a.refill(team, seed + 99);
    const DeviceBuffer fresh = test::to_device(a.reference);
    TPD_CUDA(cudaMemcpy(const_cast<void*>(want_a.get()), fresh.get(), a.reference.size() * 2, cudaMemcpyDeviceToDevice));
    TPD_CUDA(cudaMemset(mismatches.get(), 0, sizeof(unsigned)));
    graph.replay(3);
    team.synchronize();
    EXPECT_EQ(test::to_host<unsigned>(mismatches, 1)[0], 0u) << "fresh data";
    EXPECT_EQ(a.ranks_wrong(team), 0);
  });
}

}  // namespace
}  // namespace tpdecode
