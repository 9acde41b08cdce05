#include "gpu/gpu_test_util.hpp"

#include <chrono>

#include "core/bf16.hpp"
#include "core/device.cuh"
#include "core/streams.hpp"
#include "reference/gemm.hpp"
#include "tpdecode/local_team.hpp"
#include "tpdecode/nccl_team.hpp"

namespace tpdecode::test {

namespace {

__device__ void spin_ns(uint64_t ns) {
  const uint64_t until = dev::global_timer_ns() + ns;
  while (dev::global_timer_ns() < until) {
  }
}

__global__ void spin_kernel(uint64_t ns) { spin_ns(ns); }
__global__ void spin_by_kernel(const uint64_t* ns) { spin_ns(*ns); }

__global__ void mismatch_kernel(const uint16_t* got, const uint16_t* want, std::size_t n, unsigned* counter) {
  unsigned bad = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x)
    bad += got[i] != want[i];
  if (bad) atomicAdd(counter, bad);
}

}  // namespace

bool have_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return false;
  }
  cudaDeviceProp p{};
  return cudaGetDeviceProperties(&p, 0) == cudaSuccess && p.major == 9;
}

std::vector<uint16_t> random_bf16(std::size_t n, std::mt19937_64& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = bf16::from_float(dist(rng));
  return v;
}

double relative_error(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  std::vector<double> a(got.size()), b(want.size());
  for (std::size_t i = 0; i < got.size(); ++i) a[i] = bf16::to_float(got[i]);
  for (std::size_t i = 0; i < want.size(); ++i) b[i] = bf16::to_float(want[i]);
  return reference::relative_error(a, b);
}

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  return reference::relative_error(std::vector<double>(got.begin(), got.end()),
                                   std::vector<double>(want.begin(), want.end()));
}

void upload(DeviceBuffer& d, const void* host, std::size_t bytes) {
  TPD_CUDA(cudaMemcpy(d.get(), host, bytes, cudaMemcpyHostToDevice));
}

void poison(DeviceBuffer& d, cudaStream_t stream) { TPD_CUDA(cudaMemsetAsync(d.get(), 0xFF, d.bytes(), stream)); }

void spin(cudaStream_t stream, double ms) {
  spin_kernel<<<1, 1, 0, stream>>>(static_cast<uint64_t>(ms * 1e6));
  TPD_CUDA(cudaGetLastError());
}

void spin_by(cudaStream_t stream, const uint64_t* ns) {
  spin_by_kernel<<<1, 1, 0, stream>>>(ns);
  TPD_CUDA(cudaGetLastError());
}

void count_mismatches(const void* got, const void* want, std::size_t n, unsigned* counter, cudaStream_t stream) {
  mismatch_kernel<<<64, 256, 0, stream>>>(static_cast<const uint16_t*>(got), static_cast<const uint16_t*>(want), n,
                                          counter);
  TPD_CUDA(cudaGetLastError());
}

TeamGraph::TeamGraph(const Team& team, const std::function<void()>& enqueue) {
  std::vector<cudaStream_t> streams;
  for (int i = 0; i < team.driven(); ++i) streams.push_back(team.stream(i));
  origin_ = streams[0];
  TPD_CUDA(cudaStreamBeginCapture(origin_, cudaStreamCaptureModeThreadLocal));
  fork_streams(origin_, streams);
  enqueue();
  join_streams(origin_, streams);
  TPD_CUDA(cudaStreamEndCapture(origin_, &graph_));
  TPD_CUDA(cudaGraphInstantiate(&exec_, graph_, 0));
}

TeamGraph::~TeamGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
}

void TeamGraph::replay(int times) {
  for (int i = 0; i < times; ++i) TPD_CUDA(cudaGraphLaunch(exec_, origin_));
  TPD_CUDA(cudaStreamSynchronize(origin_));
}

uint64_t fresh_seed() {
  const uint64_t s = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  ::testing::Test::RecordProperty("seed", std::to_string(s));
  return s;
}

std::vector<int> nccl_team_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  int size = 1;
  while (size * 2 <= n && size * 2 <= kMaxRanks) size *= 2;
  std::vector<int> d;
  for (int i = 0; size >= 2 && i < size; ++i) d.push_back(i);
  return d;
}

void for_each_team(const std::function<void(Team&)>& body, const TeamOptions& options) {
  for (int tp : {2, 4, 8}) {
    SCOPED_TRACE(testing::Message() << "local team TP " << tp);
    LocalTeam team(tp, 0, options);
    body(team);
  }
  const std::vector<int> devices = nccl_team_devices();
  std::string why;
  if (devices.size() < 2 || !nccl_team_available(&why)) return;
  SCOPED_TRACE(testing::Message() << "NCCL team TP " << devices.size());
  NcclTeam::run_threads(devices, [&](NcclTeam& team) { body(team); }, options);
}

}  // namespace tpdecode::test
