// Batch-invariant mode (CommConfig::batch_invariant) on every team this machine
// has: a row's output bits are the same whatever the call's row count (1 ... more
// than rows_cap: further mailbox calls) and whichever path runs it (automatic,
// one-shot, two-shot, stock), on partials whose sums reveal their order (the
// planted {2^24, 1, -2^24, 1}) and a column whose sum is the sentinel word (+0, -0)
// with no partial equal to it; in a CUDA graph too.
#include <gtest/gtest.h>

#include "gpu/comm_cases.hpp"
#include "gpu/gpu_test_util.hpp"
#include "reference/all_reduce.hpp"
#include "core/bf16.hpp"
#include "tpdecode/comm.hpp"

namespace tpdecode {
namespace {

using test::team_streams;

constexpr int kRowsCap = 16;
constexpr int kMaxRows = 40;  // calls of up to 40 rows on mailboxes of 16
constexpr int64_t kHidden = 7168;

std::vector<int> row_counts() {
  if (test::quick()) return {1, 17, kMaxRows};
  return {1, 2, 3, 5, 7, 8, 13, 16, 17, 21, 33, kMaxRows};
}

constexpr CommAlgorithm kAlgorithms[] = {CommAlgorithm::kAuto, CommAlgorithm::kOneShot, CommAlgorithm::kTwoShot,
                                         CommAlgorithm::kStock};

// In every row, columns 2 and 3 of every rank hold (x_r, -0) with x_r = ±2^k
// cancelling pairwise in rank order: the sum is (+0, -0), the sentinel word, though
// no rank sends it.
void plant_sentinel_sums(std::vector<std::vector<uint16_t>>& partials, int rows) {
  for (std::size_t r = 0; r < partials.size(); ++r)
    for (int row = 0; row < rows; ++row) {
      const float x = std::ldexp(r % 2 ? -1.0f : 1.0f, static_cast<int>(r / 2));
      partials[r][static_cast<std::size_t>(row * kHidden + 2)] = bf16::from_float(x);
      partials[r][static_cast<std::size_t>(row * kHidden + 3)] = 0x8000;
    }
}

// Every driven rank's rows, in device buffers of kMaxRows rows.
struct Rows {
  std::vector<DeviceBuffer> d;
  Rows(const Team& team, const std::vector<std::vector<uint16_t>>* per_rank) {
    for (int i = 0; i < team.driven(); ++i) {
      if (per_rank)
        d.push_back(test::to_device((*per_rank)[static_cast<std::size_t>(team.rank(i))]));
      else
        d.emplace_back(static_cast<std::size_t>(kMaxRows * kHidden * 2));
    }
  }
  TensorView view(int i, int rows) const {
    return TensorView::bf16(const_cast<void*>(d[static_cast<std::size_t>(i)].get()), rows, kHidden);
  }
  void poison() {
    for (DeviceBuffer& b : d) test::poison(b);
    TPD_CUDA(cudaDeviceSynchronize());
  }
  // Driven ranks whose first `rows` rows differ from want's.
  int ranks_differing(const std::vector<uint16_t>& want, int rows) const {
    const std::vector<uint16_t> w(want.begin(), want.begin() + rows * kHidden);
    int wrong = 0;
    for (const DeviceBuffer& b : d) wrong += test::to_host<uint16_t>(b, w.size()) != w;
    return wrong;
  }
};

// Mailboxes of kRowsCap rows at kHidden, batch-invariant.
CommConfig invariant_config() {
  CommConfig cc;
  cc.hidden = kHidden;
  cc.rows_cap = kRowsCap;
  cc.batch_invariant = true;
  return cc;
}

TEST(BatchInvariant, ARowsBitsAreTheSameForEveryRowCountAndPath) {
  TPD_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  test::for_each_team([&](Team& team) {
    TpComm comm(team, invariant_config());
    const std::vector<cudaStream_t> streams = team_streams(team);
    std::vector<std::vector<uint16_t>> partials = test::make_partials(team.size(), kMaxRows, kHidden, seed);
    plant_sentinel_sums(partials, kMaxRows);
    std::mt19937_64 rng(seed + 1);
    const std::vector<std::vector<uint16_t>> residual(team.size(), test::random_bf16(kMaxRows * kHidden, rng, 4.0f));
    const std::vector<uint16_t> weight = test::random_bf16(kHidden, rng, 0.5f);
    const std::vector<uint16_t> summed = reference::all_reduce(partials, true);
    ASSERT_EQ(summed[3], 0x0000) << "the planted sum is the sentinel word, cleaned";
    const reference::ArNormResult normed = reference::ar_norm(partials, residual[0], weight, 1e-6f, kHidden, true);
    const Rows x(team, &partials), res(team, &residual);
    const DeviceBuffer w = test::to_device(weight);
    Rows out(team, nullptr), new_res(team, nullptr);
    std::vector<uint16_t> canonical_norm;  // the first ArNorm call's output (within an ulp of the reference)
    for (CommAlgorithm algorithm : kAlgorithms) {
      comm.set_algorithm(algorithm);
      for (int rows : row_counts()) {
        SCOPED_TRACE(testing::Message() << "TP " << team.size() << " algorithm " << static_cast<int>(algorithm)
                                        << " rows " << rows);
        std::vector<AllReduceIo> a;
        std::vector<ArNormIo> n;
        for (int i = 0; i < team.driven(); ++i) {
          a.push_back({x.view(i, rows), out.view(i, rows)});
          n.push_back({x.view(i, rows), res.view(i, rows), TensorView::bf16(const_cast<void*>(w.get()), 1, kHidden),
                       1e-6f, out.view(i, rows), new_res.view(i, rows)});
        }
        out.poison();
        comm.all_reduce(a, streams);
        team.synchronize();
        EXPECT_EQ(out.ranks_differing(summed, rows), 0) << "all_reduce";
        out.poison();
        new_res.poison();
        comm.ar_norm(n, streams);
        team.synchronize();
        EXPECT_EQ(new_res.ranks_differing(normed.residual_out, rows), 0) << "ar_norm's new residual";
        if (canonical_norm.empty()) {
          ASSERT_EQ(rows, 1);
          comm.set_algorithm(CommAlgorithm::kAuto);
          std::vector<ArNormIo> all;
          for (int i = 0; i < team.driven(); ++i)
            all.push_back({x.view(i, kMaxRows), res.view(i, kMaxRows),
                           TensorView::bf16(const_cast<void*>(w.get()), 1, kHidden), 1e-6f, out.view(i, kMaxRows),
                           new_res.view(i, kMaxRows)});
          comm.ar_norm(all, streams);
          team.synchronize();
          canonical_norm = test::to_host<uint16_t>(out.d[0], static_cast<std::size_t>(kMaxRows * kHidden));
          for (std::size_t e = 0; e < canonical_norm.size(); ++e)
            ASSERT_LE(bf16::ulp_distance(canonical_norm[e], normed.out[e]), 1) << e;
          comm.set_algorithm(algorithm);
          comm.ar_norm(n, streams);  // this row count's call again, into the checked outputs
          team.synchronize();
        }
        EXPECT_EQ(out.ranks_differing(canonical_norm, rows), 0) << "ar_norm's output";
      }
    }
  });
}

TEST(BatchInvariant, GathersMoveTheSameBitsOnEveryPathAndRowCount) {
  TPD_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  test::for_each_team([&](Team& team) {
    TpComm comm(team, invariant_config());
    const std::vector<cudaStream_t> streams = team_streams(team);
    for (DType dtype : {DType::kBF16, DType::kF32, DType::kI32}) {
      for (CommAlgorithm algorithm : {CommAlgorithm::kAuto, CommAlgorithm::kStock}) {
        comm.set_algorithm(algorithm);
        for (int rows : {1, kRowsCap, kMaxRows}) {
          SCOPED_TRACE(testing::Message() << "TP " << team.size() << " " << dtype_name(dtype) << " rows " << rows
                                          << " algorithm " << static_cast<int>(algorithm));
          test::GatherCase g(team, rows, 256, dtype, seed + static_cast<uint64_t>(rows));
          comm.gather(g.io, streams);
          team.synchronize();
          // Sentinel words arrive as 0 on every path, except i32 (never through a mailbox).
          EXPECT_EQ(g.ranks_wrong(team, dtype != DType::kI32), 0);
        }
      }
    }
  });
}

// Calls of more rows than the mailboxes hold, captured once and replayed back to
// back with every replay's output checked in the graph.
TEST(BatchInvariant, GraphOfCallsAboveRowsCapReplayedBackToBack) {
  TPD_REQUIRE_GPU();
  const int replays = test::quick() ? 50 : 1000;
  const uint64_t seed = test::fresh_seed();
  test::for_each_team([&](Team& team) {
    TpComm comm(team, invariant_config());
    const std::vector<cudaStream_t> streams = team_streams(team);
    test::AllReduceCase a(team, kMaxRows, kHidden, seed);
    const std::vector<uint16_t> want = reference::all_reduce(a.partials, true);
    const DeviceBuffer want_dev = test::to_device(want);
    test::MismatchCount mismatches(team);
    comm.all_reduce(a.io, streams);  // eager warm-up
    team.synchronize();
    test::TeamGraph graph(team, [&] {
      const CommResult r = comm.all_reduce(a.io, streams);
      EXPECT_NE(r.why.find("calls of at most"), std::string::npos) << r.why;
      mismatches.check(a.out, want_dev, want.size());
    });
    graph.replay(replays);
    team.synchronize();
    EXPECT_EQ(mismatches.read(), 0u) << replays << " replays";
  });
}

}  // namespace
}  // namespace tpdecode
