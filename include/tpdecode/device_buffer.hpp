// The one owner of device memory in tpdecode: a move-only buffer freed on its
// device when it goes.
#pragma once

#include <cstddef>

namespace tpdecode {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // `bytes` (at least 16) on the current device. Throws CudaError when out of memory.
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return data_; }
  template <class T>
  T* as() const { return static_cast<T*>(data_); }
  std::size_t bytes() const { return bytes_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  void release() noexcept;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace tpdecode
