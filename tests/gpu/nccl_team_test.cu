// The NCCL team on the GPUs this machine has (one GPU: a 1-rank team; more: every
// rank): symmetric windows and peer addresses, the stock collectives on its own
// communicator, a team split from a caller's communicator, and a team whose ranks
// do not share memory (run with NCCL_P2P_DISABLE=1) running every call through NCCL.
#include <gtest/gtest.h>
#include <nccl.h>

#include <random>
#include <vector>

#include "core/bf16.hpp"
#include "gpu/comm_cases.hpp"
#include "gpu/gpu_test_util.hpp"
#include "team/team_internals.hpp"
#include "tpdecode/comm.hpp"
#include "tpdecode/nccl_team.hpp"

namespace tpdecode {
namespace {

std::vector<int> all_devices() {
  std::vector<int> d = test::nccl_team_devices();
  return d.empty() ? std::vector<int>{0} : d;
}

TEST(NcclTeam, WindowPeerAddressesAndStockAllReduce) {
  TPD_REQUIRE_GPU();
  std::string why;
  if (!nccl_team_available(&why)) GTEST_SKIP() << why;
  const std::vector<int> devices = all_devices();
  const uint64_t seed = test::fresh_seed();
  // EXPECT, not ASSERT, inside the rank threads: a rank that returned early would
  // skip the collective calls its peers wait in.
  NcclTeam::run_threads(devices, [&](NcclTeam& team) {
    const int rank = team.rank();
    if (team.shares_memory()) {
      // A symmetric buffer filled with the word; the peer table's own entry is an
      // alias of the local buffer (NCCL's flat mapping).
      SymmetricBuffer b = allocate_symmetric_buffer(team, 4096, 0x12345678u, "test words");
      for (int p = 0; p < team.size(); ++p) EXPECT_NE(b.peers(0).base[p], nullptr);
      std::vector<uint32_t> words(1024);
      TPD_CUDA(cudaMemcpy(words.data(), b.peers(0).base[rank], 4096, cudaMemcpyDeviceToHost));
      for (uint32_t w : words) EXPECT_EQ(w, 0x12345678u);
      const uint32_t mark = 0xC0FFEE00u + static_cast<uint32_t>(rank);
      TPD_CUDA(cudaMemcpy(b.local(0), &mark, 4, cudaMemcpyHostToDevice));
      uint32_t seen = 0;
      TPD_CUDA(cudaMemcpy(&seen, b.peers(0).base[rank], 4, cudaMemcpyDeviceToHost));
      EXPECT_EQ(seen, mark);
      team.reset();
    }
    CommConfig cc;
    cc.algorithm = CommAlgorithm::kStock;
    TpComm comm(team, cc);
    test::AllReduceCase a(team, 3, 7168, seed);
    EXPECT_EQ(comm.all_reduce(a.io, test::team_streams(team)).path, CommPath::kStock);
    team.synchronize();
    // NCCL sums in its own order: equal to the rank-order sum at one or two ranks
    // only (two addends commute). Of the words as they are: the sentinel cleaning
    // in a.reference is the mailboxes' (at one rank NCCL copies a planted -0).
    if (team.size() <= 2) {
      std::vector<const uint16_t*> ranks;
      for (const std::vector<uint16_t>& p : a.partials) ranks.push_back(p.data());
      std::vector<uint16_t> sum(a.reference.size());
      bf16::reduce_rank_order(ranks, sum);
      for (int i = 0; i < team.driven(); ++i)
        EXPECT_EQ(test::to_host<uint16_t>(a.out[static_cast<std::size_t>(i)], sum.size()), sum);
    }
    // Broadcast of rank 0's bytes.
    DeviceBuffer word = test::to_device(std::vector<uint32_t>{0xAB000000u + static_cast<uint32_t>(rank)});
    team.broadcast_bytes(word.get(), 4, team.stream());
    team.synchronize();
    EXPECT_EQ(test::to_host<uint32_t>(word, 1)[0], 0xAB000000u);
  });
}

// The ranks of an NCCL team build their objects apart: a rank that built another
// TpComm (another width) is refused on every rank before anything is allocated (no
// peer stores into a layout that differs), and the team goes on with agreeing ones.
TEST(NcclTeam, ARankThatBuildsAnotherObjectIsRefusedOnEveryRank) {
  const std::vector<int> devices = test::nccl_team_devices();
  TPD_REQUIRE_NCCL_TEAM(devices);
  const uint64_t seed = test::fresh_seed();
  NcclTeam::run_threads(devices, [&](NcclTeam& team) {
    if (!team.shares_memory()) return;  // no symmetric buffers: nothing to lay out
    CommConfig other;
    if (team.rank() == 1) other.hidden = 4096;
    try {
      TpComm comm(team, other);
      ADD_FAILURE() << "rank " << team.rank() << ": a TpComm of widths that differ across the ranks was built";
    } catch (const InvalidArgument& e) {
      const std::string why = e.what();
      EXPECT_NE(why.find("; rank 1: "), std::string::npos) << why;
      EXPECT_NE(why.find("same tpdecode objects"), std::string::npos) << why;
    }
    TpComm comm(team);
    test::AllReduceCase a(team, 4, 7168, seed);
    const CommResult res = comm.all_reduce(a.io, test::team_streams(team));
    team.synchronize();
    EXPECT_NE(res.path, CommPath::kStock) << res.why;
    EXPECT_EQ(a.ranks_wrong(team), 0) << comm_path_name(res.path);
  });
}

// Engines pass their own communicator: tpdecode splits its own from it, which it may
// abort without touching the caller's. Ranks of a team without shared memory (NCCL
// peer access disabled) run every call through NCCL, with NCCL's results.
TEST(NcclTeam, FromTheCallersCommunicatorEveryPathMatchesNccl) {
  const std::vector<int> devices = test::nccl_team_devices();
  TPD_REQUIRE_NCCL_TEAM(devices);
  const int n = static_cast<int>(devices.size());
  const uint64_t seed = test::fresh_seed();
  std::vector<ncclComm_t> parents(static_cast<std::size_t>(n));
  ASSERT_EQ(ncclCommInitAll(parents.data(), n, devices.data()), ncclSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      TPD_CUDA(cudaSetDevice(devices[static_cast<std::size_t>(r)]));
      NcclTeam team(parents[static_cast<std::size_t>(r)], devices[static_cast<std::size_t>(r)]);
      TpComm comm(team);
      test::ArNormCase c(team, 4, 7168, true, seed);
      const CommResult res = comm.ar_norm(c.io, test::team_streams(team));
      team.synchronize();
      if (team.shares_memory()) {
        EXPECT_NE(res.path, CommPath::kStock) << res.why;  // a mailbox path
      } else {
        EXPECT_EQ(res.path, CommPath::kStock);
        EXPECT_NE(res.why.find("do not share memory"), std::string::npos) << res.why;
      }
      if (n == 2) EXPECT_EQ(c.ranks_wrong(team), 0) << comm_path_name(res.path);
    });
  for (auto& t : threads) t.join();
  // The caller's communicators are intact: a collective on them still works.
  DeviceBuffer one = test::to_device(std::vector<int32_t>{1});
  for (int r = 0; r < n; ++r) {
    TPD_CUDA(cudaSetDevice(devices[static_cast<std::size_t>(r)]));
    EXPECT_EQ(ncclCommDestroy(parents[static_cast<std::size_t>(r)]), ncclSuccess);
  }
  TPD_CUDA(cudaSetDevice(0));
}

}  // namespace
}  // namespace tpdecode
