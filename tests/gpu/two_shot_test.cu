// The two-shot all-reduce and its ArNorm on every team this machine has (local
// teams of 2, 4, 8 on one GPU; the NCCL team when there are 2 GPUs or more):
// bitwise against the CPU reference and against the one-shot on every rank, hidden
// sizes of real models, every row count up to 64 (rows the one-shot refuses
// included), back-to-back calls on 2 and 3 parities, and CUDA graphs replayed with
// fresh data. The late-rank timeouts are in failure_test.cu.
#include <gtest/gtest.h>

#include "gpu/comm_cases.hpp"
#include "gpu/gpu_test_util.hpp"
#include "tpdecode/comm.hpp"

namespace tpdecode {
namespace {

using test::AllReduceCase;
using test::ArNormCase;
using test::team_streams;

using Outputs = std::vector<std::vector<uint16_t>>;  // [driven rank]

Outputs outputs(const std::vector<DeviceBuffer>& buffers, std::size_t n) {
  Outputs o;
  for (const DeviceBuffer& b : buffers) o.push_back(test::to_host<uint16_t>(b, n));
  return o;
}

// Rows and hidden sizes of the bitwise test (fewer under the sanitizers; 9 and 64
// rows make the local TP 8 ArNorm's clusters loop over rows).
std::vector<int> row_counts() {
  if (test::quick()) return {1, 9, 64};
  return {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 31, 32, 47, 64};
}
std::vector<int64_t> hidden_sizes() {
  if (test::quick()) return {7168};
  return {4096, 5120, 7168, 8192};
}

// The two-shot all-reduce against the reference, then the one-shot (where it serves
// the call) on the same inputs against the two-shot's bits.
void check_all_reduce(Team& team, TpComm& comm, int rows, int64_t hidden, uint64_t seed) {
  const std::vector<cudaStream_t> streams = team_streams(team);
  AllReduceCase a(team, rows, hidden, seed);
  comm.set_algorithm(CommAlgorithm::kTwoShot);
  const CommResult r = comm.all_reduce(a.io, streams);
  EXPECT_EQ(r.path, CommPath::kTwoShot) << r.why;
  team.synchronize();
  EXPECT_EQ(a.ranks_wrong(team), 0) << "two-shot all_reduce against the reference";
  const Outputs two = outputs(a.out, a.reference.size());
  comm.set_algorithm(CommAlgorithm::kOneShot);
  if (comm.plan_all_reduce(a.io[0]).path != CommPath::kOneShot) return;
  a.refill(team, seed);  // the same partials, outputs poisoned
  comm.all_reduce(a.io, streams);
  team.synchronize();
  EXPECT_EQ(outputs(a.out, a.reference.size()), two) << "one-shot and two-shot differ";
}

// The two-shot ArNorm against the reference (residual bitwise, output within 1 ulp),
// then bitwise against the one-shot ArNorm where it serves the call.
void check_ar_norm(Team& team, TpComm& comm, int rows, int64_t hidden, bool residual, uint64_t seed) {
  const std::vector<cudaStream_t> streams = team_streams(team);
  ArNormCase n(team, rows, hidden, residual, seed);
  comm.set_algorithm(CommAlgorithm::kTwoShot);
  const CommResult r = comm.ar_norm(n.io, streams);
  EXPECT_EQ(r.path, CommPath::kTwoShot) << r.why;
  team.synchronize();
  EXPECT_EQ(n.ranks_wrong(team), 0) << "two-shot ar_norm against the reference";
  comm.set_algorithm(CommAlgorithm::kOneShot);
  if (comm.plan_ar_norm(n.io[0]).path != CommPath::kOneShot) return;
  const std::size_t size = n.reference.out.size();
  const Outputs out = outputs(n.out, size), res = outputs(n.res_out, size);
  for (int i = 0; i < team.driven(); ++i) {
    test::poison(n.out[static_cast<std::size_t>(i)]);
    test::poison(n.res_out[static_cast<std::size_t>(i)]);
  }
  TPD_CUDA(cudaDeviceSynchronize());
  comm.ar_norm(n.io, streams);
  team.synchronize();
  EXPECT_EQ(outputs(n.out, size), out) << "one-shot and two-shot ArNorm outputs differ";
  EXPECT_EQ(outputs(n.res_out, size), res) << "one-shot and two-shot new residuals differ";
}

TEST(TwoShot, AllReduceAndArNormBitwiseOnEveryRankAgainstTheReferenceAndTheOneShot) {
  TPD_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  test::for_each_team([&](Team& team) {
    for (int64_t hidden : hidden_sizes()) {
      CommConfig cc;
      cc.hidden = hidden;
      TpComm comm(team, cc);
      for (int rows : row_counts()) {
        SCOPED_TRACE(testing::Message() << "TP " << team.size() << " hidden " << hidden << " rows " << rows);
        const uint64_t s = seed + static_cast<uint64_t>(hidden * 100 + rows);
        check_all_reduce(team, comm, rows, hidden, s);
        check_ar_norm(team, comm, rows, hidden, rows % 4 != 3, s + 7);
      }
    }
  });
}

// The two-shot serves every row count up to 64 on a team that shares memory (where
// the one-shot refuses some for co-residency), and the automatic choice takes only
// served paths: the two-shot only within its measured range (crossover.hpp).
TEST(TwoShot, ServesTheRowsTheOneShotRefusesAndTheChoiceTakesOnlyServedPaths) {
  TPD_REQUIRE_GPU();
  test::for_each_team([&](Team& team) {
    TpComm comm(team);  // hidden 7168, 64 rows
    DeviceBuffer rows_buffer(64 * 7168 * 2), out_buffer(64 * 7168 * 2), residual_buffer(64 * 7168 * 2),
        weight(7168 * 2);
    for (int rows : row_counts()) {
      SCOPED_TRACE(testing::Message() << "TP " << team.size() << " rows " << rows);
      const TensorView v = TensorView::bf16(rows_buffer.get(), rows, 7168);
      const AllReduceIo a{v, v};
      ArNormIo n;
      n.x = v;
      n.out = TensorView::bf16(out_buffer.get(), rows, 7168);
      n.residual = n.residual_out = TensorView::bf16(residual_buffer.get(), rows, 7168);
      n.weight = TensorView::bf16(weight.get(), 1, 7168);
      const auto plan = [&](CommAlgorithm algorithm, bool norm) {
        comm.set_algorithm(algorithm);
        return (norm ? comm.plan_ar_norm(n) : comm.plan_all_reduce(a)).path;
      };
      for (bool norm : {false, true}) {
        EXPECT_EQ(plan(CommAlgorithm::kTwoShot, norm), CommPath::kTwoShot) << "norm " << norm;
        const CommPath one = plan(CommAlgorithm::kOneShot, norm);
        const CommPath chosen = plan(CommAlgorithm::kAuto, norm);
        if (chosen == CommPath::kOneShot) EXPECT_EQ(one, CommPath::kOneShot) << "norm " << norm;
        if (one == CommPath::kOneShot) EXPECT_NE(chosen, CommPath::kStock) << "norm " << norm;
      }
    }
  });
}

// Every call's output checked on the device (a call overwritten or read stale by
// its neighbours is counted), the two ops interleaved on one mailbox pair.
void back_to_back(Team& team, int parities, int calls, uint64_t seed) {
  CommConfig cc;
  cc.hidden = 7168;
  cc.parities = parities;
  cc.algorithm = CommAlgorithm::kTwoShot;
  TpComm comm(team, cc);
  const std::vector<cudaStream_t> streams = team_streams(team);
  AllReduceCase a(team, 16, 7168, seed);
  ArNormCase n(team, 5, 7168, true, seed + 1);
  const DeviceBuffer want_a = test::to_device(a.reference);
  const DeviceBuffer want_n = test::to_device(n.reference.residual_out);
  test::MismatchCount mismatches(team);
  for (int c = 0; c < calls; ++c) {
    const bool norm = c % 3 == 2;
    const CommResult r = norm ? comm.ar_norm(n.io, streams) : comm.all_reduce(a.io, streams);
    if (r.path != CommPath::kTwoShot) {
      ADD_FAILURE() << "call " << c << " took " << comm_path_name(r.path) << ": " << r.why;
      break;
    }
    if (norm)
      mismatches.check(n.res_out, want_n, n.reference.residual_out.size());
    else
      mismatches.check(a.out, want_a, a.reference.size());
  }
  team.synchronize();
  EXPECT_EQ(mismatches.read(), 0u) << calls << " calls, " << parities << " parities";
  EXPECT_EQ(n.ranks_wrong(team), 0);
}

TEST(TwoShot, TenThousandBackToBackCallsOnTwoAndThreeParities) {
  TPD_REQUIRE_GPU();
  const int calls = test::quick() ? 300 : 10000;
  const uint64_t seed = test::fresh_seed();
  test::for_each_team([&](Team& team) {
    back_to_back(team, 2, calls, seed);
    back_to_back(team, 3, calls / 10, seed + 2);
  });
}

// A graph of an odd number of two-shot calls (all_reduce, ar_norm, all_reduce):
// replay k+1 starts on the other parity than replay k; every output is checked in
// the graph. Then fresh partials through the same graph.
TEST(TwoShot, GraphReplayedBackToBackThenWithFreshData) {
  TPD_REQUIRE_GPU();
  const int replays = test::quick() ? 100 : 3000;
  const uint64_t seed = test::fresh_seed();
  test::for_each_team([&](Team& team) {
    CommConfig cc;
    cc.hidden = 7168;
    cc.algorithm = CommAlgorithm::kTwoShot;
    TpComm comm(team, cc);
    const std::vector<cudaStream_t> streams = team_streams(team);
    AllReduceCase a(team, 24, 7168, seed);
    ArNormCase n(team, 9, 7168, true, seed + 1);
    DeviceBuffer want_a = test::to_device(a.reference);
    const DeviceBuffer want_n = test::to_device(n.reference.residual_out);
    test::MismatchCount mismatches(team);
    comm.all_reduce(a.io, streams);  // eager warm-up
    team.synchronize();
    test::TeamGraph graph(team, [&] {
      EXPECT_EQ(comm.all_reduce(a.io, streams).path, CommPath::kTwoShot);
      mismatches.check(a.out, want_a, a.reference.size());
      EXPECT_EQ(comm.ar_norm(n.io, streams).path, CommPath::kTwoShot);
      mismatches.check(n.res_out, want_n, n.reference.residual_out.size());
      comm.all_reduce(a.io, streams);
      mismatches.check(a.out, want_a, a.reference.size());
    });
    graph.replay(replays);
    team.synchronize();
    EXPECT_EQ(mismatches.read(), 0u) << replays << " replays";
    a.refill(team, seed + 99);
    test::upload(want_a, a.reference.data(), a.reference.size() * 2);
    mismatches.reset();
    graph.replay(3);
    team.synchronize();
    EXPECT_EQ(mismatches.read(), 0u) << "fresh data";
    EXPECT_EQ(a.ranks_wrong(team), 0);
    EXPECT_EQ(n.ranks_wrong(team), 0);
  });
}

}  // namespace
}  // namespace tpdecode
