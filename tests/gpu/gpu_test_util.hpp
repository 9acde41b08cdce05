// Helpers of the GPU tests: skip without a device, random BF16 data, poison, host
// copies, CUDA graphs over a team's streams, a spin kernel that delays a stream, and
// a mismatch counter that checks outputs inside a graph.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tpdecode/device_buffer.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/team.hpp"

namespace tpdecode::test {

using tpdecode::DeviceBuffer;

// True when a CUDA GPU of compute capability 9.x is visible.
bool have_gpu();

// Skips the test cleanly on a machine without a suitable GPU.
#define TPD_REQUIRE_GPU()                                              \
  do {                                                                 \
    if (!::tpdecode::test::have_gpu()) GTEST_SKIP() << "no sm_90 GPU"; \
  } while (0)

// Reduced repetition counts (TPDECODE_QUICK set: under the sanitizers).
inline bool quick() { return std::getenv("TPDECODE_QUICK") != nullptr; }
// Small shapes and one row count per launch shape only (TPDECODE_SMALL set: under
// racecheck, which runs the engines' kernels about a thousand times slower); the
// wgmma engine's test then runs one weight at splits 1 and 3, without cuBLAS.
inline bool small() { return std::getenv("TPDECODE_SMALL") != nullptr; }

// Random BF16 values: normal(0, scale), rounded; never all zeros.
std::vector<uint16_t> random_bf16(std::size_t n, std::mt19937_64& rng, float scale = 1.0f);

// Host <-> device copies (synchronous).
void upload(DeviceBuffer& d, const void* host, std::size_t bytes);
template <class T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer d(v.size() * sizeof(T));
  upload(d, v.data(), v.size() * sizeof(T));
  return d;
}
template <class T>
std::vector<T> to_host(const DeviceBuffer& d, std::size_t n) {
  std::vector<T> v(n);
  TPD_CUDA(cudaMemcpy(v.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// Relative Frobenius error of BF16 or FP32 values against a reference
// (reference::relative_error of their values).
double relative_error(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want);
double relative_error(const std::vector<float>& got, const std::vector<float>& want);

// Fills every byte with 0xFF (BF16 0xFFFF, a NaN pattern no kernel writes): an
// unwritten output element is then detectable.
void poison(DeviceBuffer& d, cudaStream_t stream = nullptr);
inline constexpr uint16_t kPoison16 = 0xFFFF;

// Keeps `stream` busy for `ms` milliseconds (one spinning thread): a rank that
// arrives late. spin_by reads the nanoseconds from device memory when it runs (a
// delay inside a CUDA graph, set between replays).
void spin(cudaStream_t stream, double ms);
void spin_by(cudaStream_t stream, const uint64_t* ns);

// Adds to *counter the number of the n 16-bit words at `got` that differ from
// `want`, on `stream` (capturable: checks every replay of a graph).
void count_mismatches(const void* got, const void* want, std::size_t n, unsigned* counter, cudaStream_t stream);

// A CUDA graph of work on every driven rank's stream of a team: captured on the
// first rank's stream, forked to the others and joined back. replay() runs it
// `times` times back to back, then waits.
class TeamGraph {
 public:
  TeamGraph(const Team& team, const std::function<void()>& enqueue);
  ~TeamGraph();
  TeamGraph(const TeamGraph&) = delete;
  TeamGraph& operator=(const TeamGraph&) = delete;
  void replay(int times = 1);

 private:
  cudaStream_t origin_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// A seed that differs between runs (fresh random data) and is recorded.
uint64_t fresh_seed();

// The largest power-of-two team of visible GPUs (empty below 2).
std::vector<int> nccl_team_devices();

// Skips unless an NCCL team of 2 or more GPUs can be made.
#define TPD_REQUIRE_NCCL_TEAM(devices)                                             \
  do {                                                                             \
    TPD_REQUIRE_GPU();                                                             \
    std::string why_;                                                              \
    if (!::tpdecode::nccl_team_available(&why_)) GTEST_SKIP() << why_;            \
    if ((devices).size() < 2) GTEST_SKIP() << "the NCCL team needs 2 or more GPUs"; \
  } while (0)

// Runs `body` on local teams of 2, 4 and 8 ranks (one GPU) and, when there are 2
// or more GPUs, on the NCCL team (one thread per GPU; every thread's `body` sees
// its own team object).
void for_each_team(const std::function<void(Team&)>& body, const TeamOptions& options = {});

}  // namespace tpdecode::test
