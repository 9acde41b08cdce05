// Helpers of the GPU tests: skip without a device, device buffers, random BF16
// data, poison, host copies.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "tpdecode/error.hpp"
#include "tpdecode/team.hpp"

namespace tpdecode::test {

// True when a CUDA GPU of compute capability 9.x is visible.
bool have_gpu();

// Skips the test cleanly on a machine without a suitable GPU.
#define TPD_REQUIRE_GPU()                                           \
  do {                                                              \
    if (!::tpdecode::test::have_gpu()) GTEST_SKIP() << "no sm_90 GPU"; \
  } while (0)

// Owning device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  std::size_t bytes() const { return bytes_; }
  template <class T>
  T* as() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

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

// Fills every byte with 0xFF (BF16 pair NaN-ish pattern 0xFFFF): an unwritten
// output element is then detectable.
void poison(DeviceBuffer& d, cudaStream_t stream = nullptr);
inline constexpr uint16_t kPoison16 = 0xFFFF;

// Launches `launch_rank(i)` for every rank of `team` but `absent`, waits, and
// expects the others to give up within `limit_s` seconds with a TimeoutError that
// names `op` and the absent rank's slot.
void expect_absent_rank_times_out(Team& team, int absent, const std::function<void(int)>& launch_rank, const char* op,
                                  double limit_s = 3.0);

// A CUDA graph of work on every rank's stream of a team: captured on the first
// rank's stream, forked to the others and joined back; replay() runs it and waits.
class TeamGraph {
 public:
  TeamGraph(const Team& team, const std::function<void()>& enqueue);
  ~TeamGraph();
  TeamGraph(const TeamGraph&) = delete;
  TeamGraph& operator=(const TeamGraph&) = delete;
  void replay();

 private:
  cudaStream_t origin_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// A seed that differs between runs (fresh random data) and is printed on failure.
uint64_t fresh_seed();

}  // namespace tpdecode::test
