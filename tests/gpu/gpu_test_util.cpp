#include "gpu/gpu_test_util.hpp"

#include <chrono>

#include "tpdecode/bf16.hpp"
#include "tpdecode/streams.hpp"

namespace tpdecode::test {

bool have_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return false;
  }
  cudaDeviceProp p{};
  return cudaGetDeviceProperties(&p, 0) == cudaSuccess && p.major == 9;
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) { TPD_CUDA(cudaMalloc(&p_, bytes ? bytes : 16)); }

DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFree(p_);
    p_ = o.p_;
    bytes_ = o.bytes_;
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

std::vector<uint16_t> random_bf16(std::size_t n, std::mt19937_64& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = bf16::from_float(dist(rng));
  return v;
}

void upload(DeviceBuffer& d, const void* host, std::size_t bytes) {
  TPD_CUDA(cudaMemcpy(d.get(), host, bytes, cudaMemcpyHostToDevice));
}

void poison(DeviceBuffer& d, cudaStream_t stream) { TPD_CUDA(cudaMemsetAsync(d.get(), 0xFF, d.bytes(), stream)); }

TeamGraph::TeamGraph(const Team& team, const std::function<void()>& enqueue) {
  std::vector<cudaStream_t> streams;
  for (int i = 0; i < team.driven(); ++i) streams.push_back(team.rank_context(i).stream);
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

void TeamGraph::replay() {
  TPD_CUDA(cudaGraphLaunch(exec_, origin_));
  TPD_CUDA(cudaStreamSynchronize(origin_));
}

void expect_absent_rank_times_out(Team& team, int absent, const std::function<void(int)>& launch_rank, const char* op,
                                  double limit_s) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < team.driven(); ++i)
    if (team.rank_context(i).rank != absent) launch_rank(i);
  team.synchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, limit_s) << "the waiting ranks did not give up near their deadline";
  EXPECT_TRUE(team.has_error());
  try {
    team.check_errors();
    ADD_FAILURE() << "no timeout was reported";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(op), std::string::npos) << what;
    EXPECT_NE(what.find("slot " + std::to_string(absent)), std::string::npos) << what;
  }
}

uint64_t fresh_seed() {
  const uint64_t s = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  ::testing::Test::RecordProperty("seed", std::to_string(s));
  return s;
}

}  // namespace tpdecode::test
