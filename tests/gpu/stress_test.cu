// The one-shot all-reduce under stress: 100,000 back-to-back calls whose data carry
// their call number, random delays on either rank before a call (one rank arrives
// late, then the other), random row counts, every output checked on the device
// against the rank-order sum computed there. On the NCCL team (peer stores over
// NVLink, the ordering the local team cannot show) and a local team of 2. With the
// library built with TPDECODE_TEST_DELAYS, the same again with random delays inside
// the kernel too (comm/test_delays.hpp: CTAs late to push, or late to read).
#include <gtest/gtest.h>

#include <random>

#include "comm/test_delays.hpp"
#include "core/bf16.hpp"
#include "core/hash.hpp"
#include "gpu/comm_cases.hpp"
#include "gpu/gpu_test_util.hpp"
#include "tpdecode/comm.hpp"
#include "tpdecode/local_team.hpp"
#include "tpdecode/nccl_team.hpp"

namespace tpdecode {
namespace {

constexpr int kWidth = 2048, kRowsCap = 8;

// Rank r's value at index i of call c: a small integer (exact in any FP32 sum).
__device__ __host__ float call_value(uint32_t call, int rank, int i) {
  return static_cast<float>(static_cast<int>(hash::keyed(call * 131u + static_cast<uint32_t>(rank), static_cast<uint64_t>(i)) % 511) - 255);
}

__global__ void fill_call_kernel(uint16_t* x, int n, uint32_t call, int rank) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    x[i] = bf16::from_float(call_value(call, rank, i));
}

// The rank-order sum of every rank's values, rounded once, compared with `got`.
__global__ void check_call_kernel(const uint16_t* got, int n, uint32_t call, int ranks, unsigned* bad) {
  unsigned wrong = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float s = call_value(call, 0, i);
    for (int r = 1; r < ranks; ++r) s += call_value(call, r, i);
    wrong += got[i] != bf16::from_float(s);
  }
  if (wrong) atomicAdd(bad, wrong);
}

void stress(Team& team, int calls, uint64_t seed) {
  CommConfig cc;
  cc.hidden = kWidth;
  cc.rows_cap = kRowsCap;
  TpComm comm(team, cc);
  const std::vector<cudaStream_t> streams = test::team_streams(team);
  std::vector<DeviceBuffer> x, out;
  for (int i = 0; i < team.driven(); ++i) {
    x.emplace_back(kRowsCap * kWidth * 2);
    out.emplace_back(kRowsCap * kWidth * 2);
  }
  DeviceBuffer bad(sizeof(unsigned));
  TPD_CUDA(cudaMemset(bad.get(), 0, sizeof(unsigned)));
  std::mt19937_64 shape_rng(seed);                           // the same on every rank
  std::mt19937_64 delay_rng(seed * 7919 + team.rank(0));     // each rank its own
  std::vector<AllReduceIo> io(static_cast<std::size_t>(team.driven()));
  int one_shot = 0;
  for (int c = 0; c < calls; ++c) {
    const int rows = 1 + static_cast<int>(shape_rng() % kRowsCap);
    const int n = rows * kWidth;
    for (int i = 0; i < team.driven(); ++i) {
      const auto k = static_cast<std::size_t>(i);
      if (delay_rng() % 64 == 0) test::spin(streams[k], static_cast<double>(delay_rng() % 40) / 1000.0);  // 0-40 us late
      fill_call_kernel<<<16, 256, 0, streams[k]>>>(x[k].as<uint16_t>(), n, static_cast<uint32_t>(c), team.rank(i));
      io[k] = {TensorView::bf16(x[k].get(), rows, kWidth), TensorView::bf16(out[k].get(), rows, kWidth)};
    }
    one_shot += comm.all_reduce(io, streams).path == CommPath::kOneShot;
    for (int i = 0; i < team.driven(); ++i) {
      const auto k = static_cast<std::size_t>(i);
      check_call_kernel<<<16, 256, 0, streams[k]>>>(out[k].as<uint16_t>(), n, static_cast<uint32_t>(c), team.size(),
                                                    bad.as<unsigned>());
    }
  }
  team.synchronize();
  EXPECT_EQ(one_shot, calls) << "every call should take the mailbox path";
  EXPECT_EQ(test::to_host<unsigned>(bad, 1)[0], 0u) << "elements differing from their call's sum";
}

TEST(Stress, HundredThousandCallNumberedCallsWithRandomDelays) {
  TPD_REQUIRE_GPU();
  const int calls = test::quick() ? 2000 : 100000;
  const uint64_t seed = test::fresh_seed();
  {
    SCOPED_TRACE("local team TP 2");
    LocalTeam team(2);
    stress(team, calls / 10, seed);
  }
  const std::vector<int> devices = test::nccl_team_devices();
  std::string why;
  if (devices.size() < 2 || !nccl_team_available(&why)) return;
  SCOPED_TRACE("NCCL team");
  NcclTeam::run_threads(devices, [&](NcclTeam& team) { stress(team, calls, seed); });
}

// Sets the in-kernel delays on the GPUs of `team`'s driven ranks for its lifetime.
class InKernelDelays {
 public:
  InKernelDelays(const Team& team, uint64_t seed) : team_(team) {
    for (int i = 0; i < team.driven(); ++i)
      set_test_delays(team.device(i), TestDelays{16, 20000, seed + static_cast<uint64_t>(team.rank(i))});
  }
  ~InKernelDelays() {
    for (int i = 0; i < team_.driven(); ++i) set_test_delays(team_.device(i), TestDelays{});
  }
  InKernelDelays(const InKernelDelays&) = delete;
  InKernelDelays& operator=(const InKernelDelays&) = delete;

 private:
  const Team& team_;
};

TEST(Stress, CallNumberedCallsWithRandomDelaysInsideTheKernel) {
  TPD_REQUIRE_GPU();
  if (!test_delays_built()) GTEST_SKIP() << "the library was built without TPDECODE_TEST_DELAYS";
  const int calls = test::quick() ? 2000 : 100000;
  const uint64_t seed = test::fresh_seed();
  {
    SCOPED_TRACE("local team TP 2");
    LocalTeam team(2);
    InKernelDelays delays(team, seed);
    stress(team, calls / 10, seed);
  }
  const std::vector<int> devices = test::nccl_team_devices();
  std::string why;
  if (devices.size() < 2 || !nccl_team_available(&why)) return;
  SCOPED_TRACE("NCCL team");
  NcclTeam::run_threads(devices, [&](NcclTeam& team) {
    InKernelDelays delays(team, seed);
    stress(team, calls, seed);
  });
}

}  // namespace
}  // namespace tpdecode
