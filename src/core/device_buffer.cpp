#include "tpdecode/device_buffer.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>

#include "tpdecode/error.hpp"

namespace tpdecode {

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  TPD_CUDA(cudaMalloc(&data_, std::max<std::size_t>(bytes, 16)));
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::release() noexcept {
  if (!data_) return;
  cudaFree(data_);  // unified addressing: any current device frees it
  data_ = nullptr;
}

}  // namespace tpdecode
