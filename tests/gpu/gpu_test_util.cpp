#include "gpu/gpu_test_util.hpp"

#include <chrono>

#include "tpdecode/bf16.hpp"

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

uint64_t fresh_seed() {
  const uint64_t s = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  ::testing::Test::RecordProperty("seed", std::to_string(s));
  return s;
}

}  // namespace tpdecode::test
