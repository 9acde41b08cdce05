// TeamProgram on local teams of 2, 4 and 8 ranks (one GPU): a layer's stretch per
// rank -- op 0 a row-parallel GEMM (the rank's partial), op 1 its all-reduce +
// residual + norm, op 2 a GEMM of that norm's out (another partial), op 3 its
// all-reduce + norm on the residual stream in place -- against the references bit
// for bit (reference/all_reduce.hpp, then reference/program_norm.hpp's order), the
// GEMMs against FP64 on their actual inputs; every rank the same bits, repeatable
// back to back; a graph of the team's runs replayed 10,000 times without a wrong
// bit; a rank that never runs: TimeoutError, NaN outputs, then reset() and correct;
// every rank's timeline recorded; refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/bf16.hpp"
#include "gpu/comm_cases.hpp"
#include "gpu/gpu_test_util.hpp"
#include "gpu/program_reference.hpp"
#include "gpu/program_runs.hpp"
#include "reference/all_reduce.hpp"
#include "reference/program_norm.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/local_team.hpp"
#include "tpdecode/team_program.hpp"

namespace tpdecode {
namespace {

using namespace test;

constexpr int64_t kHidden = 2048;  // the residual stream
constexpr int64_t kShard = 512;    // op 0's K per rank (a row-parallel o-projection's)
constexpr float kEps = 1e-6f;

// One rank's buffers and weights.
struct RankData {
  std::vector<uint16_t> x0, w0, w2;
  DeviceBuffer x0d, w0d, w2d, p, h, y, z, o;
};

// The layer stretch on every rank of a team, m rows.
struct Layer {
  int m;
  std::vector<RankData> ranks;
  std::vector<uint16_t> residual, gamma1, gamma3;
  DeviceBuffer gamma1d, gamma3d;

  Layer(int tp, int m_, std::mt19937_64& rng) : m(m_), ranks(static_cast<std::size_t>(tp)) {
    gamma1 = random_bf16(kHidden, rng);
    gamma3 = random_bf16(kHidden, rng);
    gamma1d = to_device(gamma1);
    gamma3d = to_device(gamma3);
    auto buffer = [&](int64_t cols) { return DeviceBuffer(static_cast<std::size_t>(m * cols) * 2); };
    for (RankData& r : ranks) {
      r.w0 = random_bf16(static_cast<std::size_t>(kHidden * kShard), rng, 0.05f);
      r.w2 = random_bf16(static_cast<std::size_t>(kHidden * kHidden), rng, 0.03f);
      r.w0d = to_device(r.w0);
      r.w2d = to_device(r.w2);
      r.x0d = buffer(kShard);
      r.p = buffer(kHidden);
      r.h = buffer(kHidden);
      r.y = buffer(kHidden);
      r.z = buffer(kHidden);
      r.o = buffer(kHidden);
    }
    fresh(rng);
  }

  // New inputs: every rank's x0, and the residual (the same on every rank, as a
  // replicated residual stream is); h starts as the residual.
  void fresh(std::mt19937_64& rng) {
    residual = random_bf16(static_cast<std::size_t>(m * kHidden), rng, 2.0f);
    for (RankData& r : ranks) {
      r.x0 = random_bf16(static_cast<std::size_t>(m * kShard), rng);
      upload(r.x0d, r.x0.data(), r.x0.size() * 2);
      upload(r.h, residual.data(), residual.size() * 2);
      for (DeviceBuffer* b : {&r.p, &r.y, &r.z, &r.o}) poison(*b);
    }
    TPD_CUDA(cudaDeviceSynchronize());
  }

  std::vector<std::vector<GemmProgram::Op>> ops() {
    std::vector<std::vector<GemmProgram::Op>> all;
    auto view = [&](DeviceBuffer& b, int64_t cols) { return TensorView::bf16(b.get(), m, cols); };
    for (RankData& r : ranks) {
      GemmProgram::Norm n1{view(r.p, kHidden), 0, TensorView::bf16(gamma1d.get(), 1, kHidden), kEps,
                           view(r.h, kHidden), view(r.h, kHidden), view(r.y, kHidden)};
      n1.all_reduce = true;
      GemmProgram::Norm n3{view(r.z, kHidden), 2, TensorView::bf16(gamma3d.get(), 1, kHidden), kEps,
                           view(r.h, kHidden), view(r.h, kHidden), view(r.o, kHidden)};
      n3.all_reduce = true;
      all.push_back({GemmProgram::Gemm{TensorView::bf16(r.w0d.get(), kHidden, kShard), view(r.x0d, kShard),
                                       view(r.p, kHidden)},
                     n1,
                     GemmProgram::Gemm{TensorView::bf16(r.w2d.get(), kHidden, kHidden), view(r.y, kHidden),
                                       view(r.z, kHidden), 1},
                     n3});
    }
    return all;
  }

  std::vector<uint16_t> host(DeviceBuffer& b) const { return to_host<uint16_t>(b, static_cast<std::size_t>(m * kHidden)); }

  // Every rank's outputs after one run against the references; returns rank 0's
  // final out and residual stream (what later runs must give again).
  std::pair<std::vector<uint16_t>, std::vector<uint16_t>> check(int ctas) {
    std::vector<std::vector<uint16_t>> partials, partials2;
    for (RankData& r : ranks) partials.push_back(host(r.p));
    const reference::ArNormResult r1 = reference::add_rms_norm(
        reference::all_reduce(partials), residual, gamma1, kEps, kHidden,
        [&](std::span<const uint16_t> row) { return reference::program_norm_square_sum(row, ctas); });
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      RankData& r = ranks[i];
      SCOPED_TRACE(testing::Message() << "rank " << i);
      const std::vector<uint16_t> y = host(r.y);
      EXPECT_TRUE(y == r1.out) << "op 1's out (all-reduce + residual + norm)";
      EXPECT_LT(relative_error(partials[i], gemm_reference(r.x0, r.w0, m, kShard, kHidden)), 4e-3) << "op 0";
      partials2.push_back(host(r.z));
      EXPECT_LT(relative_error(partials2.back(), gemm_reference(y, r.w2, m, kHidden, kHidden)), 4e-3) << "op 2";
    }
    const reference::ArNormResult r3 = reference::add_rms_norm(
        reference::all_reduce(partials2), r1.residual_out, gamma3, kEps, kHidden,
        [&](std::span<const uint16_t> row) { return reference::program_norm_square_sum(row, ctas); });
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      SCOPED_TRACE(testing::Message() << "rank " << i);
      EXPECT_TRUE(host(ranks[i].o) == r3.out) << "op 3's out";
      EXPECT_TRUE(host(ranks[i].h) == r3.residual_out) << "the residual stream after op 3";
    }
    return {r3.out, r3.residual_out};
  }
};

TEST(TeamProgram, AllReduceNormsGiveTheReferenceBitsOnEveryRank) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  for (int tp : {2, 4, 8}) {
    LocalTeam team(tp);
    for (int m : {1, 5, 16}) {
      if (quick() && m != 5) continue;
      SCOPED_TRACE(testing::Message() << "local TP " << tp << ", m " << m);
      Layer layer(tp, m, rng);
      const TeamProgram program(team, layer.ops(), m);
      EXPECT_EQ(program.ctas(), program.program(0).ctas());
      for (int call = 0; call < 3; ++call) {  // fresh data each call, calls back to back
        layer.fresh(rng);
        program.run();
        team.synchronize();
        layer.check(program.ctas());
      }
      // Back to back with the same inputs: the same bits (the residual re-uploaded).
      for (RankData& r : layer.ranks) upload(r.h, layer.residual.data(), layer.residual.size() * 2);
      TPD_CUDA(cudaDeviceSynchronize());
      program.run();
      team.synchronize();
      const std::vector<uint16_t> first = layer.host(layer.ranks[0].o);
      for (RankData& r : layer.ranks) upload(r.h, layer.residual.data(), layer.residual.size() * 2);
      TPD_CUDA(cudaDeviceSynchronize());
      program.run();
      team.synchronize();
      for (RankData& r : layer.ranks) EXPECT_TRUE(layer.host(r.o) == first) << "a repeat run's bits";
    }
  }
}

// With record_timeline, every rank's program records its runs (the last 8) and
// gives the reference bits all the same; without, none.
TEST(TeamProgram, EveryRankRecordsItsTimeline) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  constexpr int kTp = 4, kM = 5;
  LocalTeam team(kTp);
  Layer layer(kTp, kM, rng);
  const TeamProgram plain(team, layer.ops(), kM);
  const TeamProgram traced(team, layer.ops(), kM, true);
  for (int call = 0; call < 10; ++call) {
    layer.fresh(rng);
    traced.run();
    team.synchronize();
    layer.check(traced.ctas());
  }
  plain.run();
  team.synchronize();
  for (int i = 0; i < kTp; ++i) {
    SCOPED_TRACE(testing::Message() << "rank " << i);
    EXPECT_TRUE(plain.program(i).timelines().empty());
    expect_timelines(traced.program(i), 8);
  }
}

// A graph of the team's runs, each followed by a check of every rank's out against
// the expected bits (the residual reset from a copy first: op 3 updates it in place).
TEST(TeamProgram, GraphReplaysKeepEveryBit) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  constexpr int kTp = 4, kM = 5;
  LocalTeam team(kTp);
  Layer layer(kTp, kM, rng);
  const TeamProgram program(team, layer.ops(), kM);
  program.run();
  team.synchronize();
  const auto [out, stream] = layer.check(program.ctas());
  DeviceBuffer want = to_device(out), start = to_device(layer.residual);
  DeviceBuffer counter(4);
  TPD_CUDA(cudaMemset(counter.get(), 0, 4));
  const std::size_t bytes = layer.residual.size() * 2;
  TeamGraph graph(team, [&] {
    for (int i = 0; i < kTp; ++i)
      TPD_CUDA(cudaMemcpyAsync(layer.ranks[static_cast<std::size_t>(i)].h.get(), start.get(), bytes,
                               cudaMemcpyDeviceToDevice, team.stream(i)));
    program.run();
    for (int i = 0; i < kTp; ++i)
      count_mismatches(layer.ranks[static_cast<std::size_t>(i)].o.get(), want.get(), out.size(),
                       static_cast<unsigned*>(counter.get()), team.stream(i));
  });
  // Under racecheck (small()) the process's host memory grows with the replays: 1000
  // replays of 4 ranks reached 130 GB and the OOM killer ended the process.
  const int replays = small() ? 20 : quick() ? 1000 : 10000;
  graph.replay(replays);
  team.synchronize();
  EXPECT_EQ(to_host<uint32_t>(counter, 1)[0], 0u) << "wrong bits over " << replays << " replays";
}

// Rank 3 of 4 never runs its program: the others time out (TimeoutError naming the
// team program), every output of the ops from the all-reduce on is NaN, nothing
// hangs; after reset() on the team the same programs run correctly again.
TEST(TeamProgram, AbsentRankTimesOutThenResetRecovers) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  constexpr int kTp = 4, kM = 3;
  TeamOptions options;
  options.timeout_ms = 200;
  LocalTeam team(kTp, 0, options);
  Layer layer(kTp, kM, rng);
  const TeamProgram program(team, layer.ops(), kM);
  for (int i = 0; i < kTp - 1; ++i) program.program(i).run(team.stream(i), false);
  std::string what;
  try {
    team.synchronize();
    ADD_FAILURE() << "no error was raised";
  } catch (const TimeoutError& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("team program"), std::string::npos) << what;
  for (int i = 0; i < kTp - 1; ++i) {
    SCOPED_TRACE(testing::Message() << "rank " << i);
    EXPECT_TRUE(all_nan(layer.ranks[static_cast<std::size_t>(i)].y, static_cast<std::size_t>(kM * kHidden)));
    EXPECT_TRUE(all_nan(layer.ranks[static_cast<std::size_t>(i)].o, static_cast<std::size_t>(kM * kHidden)));
  }
  team.reset();
  // The same programs: reset() re-armed the team mailbox and zeroed its epochs; each
  // program's own counters were left consistent by its completed run.
  for (int call = 0; call < 2; ++call) {
    layer.fresh(rng);
    program.run();
    team.synchronize();
    layer.check(program.ctas());
  }
}

TEST(TeamProgram, Refusals) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  LocalTeam team(2);
  Layer layer(2, 2, rng);
  // An all-reduce norm outside a TeamProgram.
  EXPECT_THROW(GemmProgram(layer.ops()[0], 2), InvalidArgument);
  // Lists for the wrong number of ranks; ranks whose all-reduce ops differ.
  std::vector<std::vector<GemmProgram::Op>> one = {layer.ops()[0]};
  EXPECT_THROW(TeamProgram(team, one, 2), InvalidArgument);
  std::vector<std::vector<GemmProgram::Op>> differ = layer.ops();
  differ[1][3].norm.all_reduce = false;
  EXPECT_THROW(TeamProgram(team, differ, 2), InvalidArgument);
  // A folded all-reduce norm.
  std::vector<std::vector<GemmProgram::Op>> folded = layer.ops();
  for (auto& ops : folded) ops[1].norm.folded = true;
  EXPECT_THROW(TeamProgram(team, folded, 2), InvalidArgument);
  // One stream for both ranks: rank 1 would queue behind rank 0's wait for it.
  const TeamProgram program(team, layer.ops(), 2);
  const std::vector<cudaStream_t> shared = {team.stream(0), team.stream(0)};
  EXPECT_THROW(program.run(shared), InvalidArgument);
  team.check_errors();  // nothing ran
}

}  // namespace
}  // namespace tpdecode
