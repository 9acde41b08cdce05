// The mailbox collectives over the NCCL team, one thread per GPU: what the local
// team checks on one GPU, across real GPUs (peer stores over NVLink). Skips with
// fewer than 2 GPUs. Every thread draws all ranks' data from one seed, so each can
// compute the reference and check its own rank's outputs against it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <vector>

#include "gpu/comm_test_util.hpp"
#include "gpu/gpu_test_util.hpp"
#include "tpdecode/all_reduce.hpp"
#include "tpdecode/ar_norm.hpp"
#include "tpdecode/bf16.hpp"
#include "tpdecode/gather.hpp"
#include "tpdecode/nccl_team.hpp"
#include "reference/all_reduce.hpp"
#include "reference/gather.hpp"

namespace tpdecode {
namespace {

// The largest power-of-two team of visible GPUs (empty below 2).
std::vector<int> team_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  int size = 1;
  while (size * 2 <= n && size * 2 <= kMaxRanks) size *= 2;
  std::vector<int> d;
  for (int i = 0; size >= 2 && i < size; ++i) d.push_back(i);
  return d;
}

#define TPD_REQUIRE_NCCL_TEAM(devices)                                             \
  do {                                                                             \
    TPD_REQUIRE_GPU();                                                             \
    std::string why;                                                               \
    if (!nccl_team_available(&why)) GTEST_SKIP() << why;                           \
    if ((devices).size() < 2) GTEST_SKIP() << "the NCCL team needs 2 or more GPUs"; \
  } while (0)

// Own rank's ArNorm outputs against the reference: residual bitwise, out within 1 ulp.
void expect_ar_norm_rank(const test::ArNormCase& c, int rank, const char* what) {
  const reference::ArNormResult ref = c.reference();
  const auto k = static_cast<std::size_t>(rank);
  const std::size_t n = ref.out.size();
  const std::vector<uint16_t> res = test::to_host<uint16_t>(c.res_out[k], n);
  const std::vector<uint16_t> out = test::to_host<uint16_t>(c.out[k], n);
  long res_bad = 0, out_bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    res_bad += res[i] != ref.residual_out[i];
    out_bad += bf16::ulp_distance(out[i], ref.out[i]) > 1;
  }
  EXPECT_EQ(res_bad, 0) << what << ": rank " << rank << " residual differs from the reference";
  EXPECT_EQ(out_bad, 0) << what << ": rank " << rank << " output more than 1 ulp from the reference";
}

TEST(NcclCollectives, AllReduceAndArNormBitwiseBackToBack) {
  const std::vector<int> devices = team_devices();
  TPD_REQUIRE_NCCL_TEAM(devices);
  const uint64_t seed = test::fresh_seed();
  const int calls = test::quick() ? 20 : 400;
  NcclTeam::run_threads(devices, [&](NcclTeam& team) {
    const int rank = team.rank(), tp = team.size();
    constexpr int kHidden = 7168;
    Mailbox box(team, all_reduce_mailbox_shape(tp, 64, kHidden));
    for (int call = 0; call < calls; ++call) {
      const int rows = 1 + (call * 7) % 64;
      std::mt19937_64 rng(seed + static_cast<uint64_t>(call));
      test::ArNormCase c = test::make_ar_norm_case(tp, rows, kHidden, call % 8 != 3, rng);
      const auto k = static_cast<std::size_t>(rank);
      // Parities strictly alternate (the reuse rule); the op changes every two calls.
      const int parity = call % 2;
      if (call / 2 % 2 == 0) {
        all_reduce(team.rank_context(0), box.view(0, parity), TensorView::bf16(c.x[k].get(), rows, kHidden),
                   TensorView::bf16(c.out[k].get(), rows, kHidden));
        team.synchronize();
        team.check_errors();
        const std::vector<uint16_t> ref = reference::all_reduce(c.x_host);
        EXPECT_EQ(test::to_host<uint16_t>(c.out[k], ref.size()), ref) << "call " << call << " rank " << rank;
      } else {
        ar_norm(team.rank_context(0), box.view(0, parity), c.io(rank));
        team.synchronize();
        team.check_errors();
        expect_ar_norm_rank(c, rank, "ar_norm");
      }
    }
  });
}

TEST(NcclCollectives, GatherBytesWithPlantedSentinels) {
  const std::vector<int> devices = team_devices();
  TPD_REQUIRE_NCCL_TEAM(devices);
  const uint64_t seed = test::fresh_seed();
  NcclTeam::run_threads(devices, [&](NcclTeam& team) {
    const int rank = team.rank(), tp = team.size();
    constexpr int kWords = 896;  // a context-projection shard at TP 8: 7168 / 8 BF16 = 448 words
    Mailbox box(team, gather_mailbox_shape(tp, 64, kWords * 4));
    for (int call = 0; call < 40; ++call) {
      const int rows = 1 + (call * 5) % 64;
      std::mt19937_64 rng(seed + static_cast<uint64_t>(call));
      std::vector<std::vector<uint32_t>> shards;
      for (int r = 0; r < tp; ++r) shards.push_back(test::random_words(static_cast<std::size_t>(rows) * kWords, rng));
      test::DeviceBuffer shard = test::to_device(shards[static_cast<std::size_t>(rank)]);
      test::DeviceBuffer out(static_cast<std::size_t>(rows) * kWords * tp * 4);
      test::poison(out);
      const TensorView shard_view{shard.get(), DType::kI32, rows, kWords, kWords};
      const TensorView out_view{out.get(), DType::kI32, rows, kWords * tp, kWords * tp};
      gather(team.rank_context(0), box.view(0, call % 2), shard_view, out_view, GatherMode::kCopy);
      team.synchronize();
      team.check_errors();
      const std::vector<uint32_t> ref = reference::gather(shards, rows, kWords);
      EXPECT_EQ(test::to_host<uint32_t>(out, ref.size()), ref) << "call " << call << " rank " << rank;
    }
  });
}

TEST(NcclCollectives, GraphReplayWithFreshData) {
  const std::vector<int> devices = team_devices();
  TPD_REQUIRE_NCCL_TEAM(devices);
  const uint64_t seed = test::fresh_seed();
  NcclTeam::run_threads(devices, [&](NcclTeam& team) {
    const int rank = team.rank(), tp = team.size();
    constexpr int kRows = 4, kHidden = 4096;
    Mailbox box(team, all_reduce_mailbox_shape(tp, 8, kHidden));
    std::mt19937_64 rng(seed);
    test::ArNormCase c = test::make_ar_norm_case(tp, kRows, kHidden, true, rng);
    test::TeamGraph graph(team, [&] {
      for (int call = 0; call < 4; ++call) ar_norm(team.rank_context(0), box.view(0, call % 2), c.io(rank));
    });
    for (int replay = 0; replay < 10; ++replay) {
      // Every thread draws the same fresh data; each uploads its own rank's.
      const test::ArNormCase fresh = test::make_ar_norm_case(tp, kRows, kHidden, true, rng);
      const auto k = static_cast<std::size_t>(rank);
      c.x_host = fresh.x_host;
      c.residual_host = fresh.residual_host;
      test::upload(c.x[k], c.x_host[k].data(), c.x_host[k].size() * 2);
      test::upload(c.res[k], c.residual_host.data(), c.residual_host.size() * 2);
      test::poison(c.out[k]);
      TPD_CUDA(cudaDeviceSynchronize());
      graph.replay();
      team.check_errors();
      expect_ar_norm_rank(c, rank, "graph replay");
    }
  });
}

TEST(NcclCollectives, AbsentRankTimesOutThenResetRecovers) {
  const std::vector<int> devices = team_devices();
  TPD_REQUIRE_NCCL_TEAM(devices);
  const uint64_t seed = test::fresh_seed();
  TeamOptions options;
  options.timeout_ms = 300;
  NcclTeam::run_threads(
      devices,
      [&](NcclTeam& team) {
        const int rank = team.rank(), tp = team.size();
        constexpr int kRows = 3, kHidden = 4096;
        Mailbox box(team, all_reduce_mailbox_shape(tp, 8, kHidden));
        std::mt19937_64 rng(seed);
        const test::ArNormCase c = test::make_ar_norm_case(tp, kRows, kHidden, false, rng);
        const auto k = static_cast<std::size_t>(rank);
        const int absent = tp - 1;
        if (rank != absent) {
          test::expect_absent_rank_times_out(
              team, absent,
              [&](int i) {
                all_reduce(team.rank_context(i), box.view(i, 0), TensorView::bf16(c.x[k].get(), kRows, kHidden),
                           TensorView::bf16(c.out[k].get(), kRows, kHidden));
              },
              "all_reduce");
        }
        team.reset();  // collective: the absent rank joins here
        EXPECT_FALSE(team.has_error());
        for (int parity : {0, 1}) {
          all_reduce(team.rank_context(0), box.view(0, parity), TensorView::bf16(c.x[k].get(), kRows, kHidden),
                     TensorView::bf16(c.out[k].get(), kRows, kHidden));
          team.synchronize();
          team.check_errors();
          const std::vector<uint16_t> ref = reference::all_reduce(c.x_host);
          EXPECT_EQ(test::to_host<uint16_t>(c.out[k], ref.size()), ref) << "after reset, rank " << rank;
        }
      },
      options);
}

}  // namespace
}  // namespace tpdecode
