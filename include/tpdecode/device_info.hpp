// What this machine offers: GPUs, peer access, VMM and multicast attributes (read
// only: nothing is ever created), cluster launch, NCCL, and which team backends can
// serve here.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace tpdecode {

struct GpuInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sms = 0;
  std::size_t memory_bytes = 0;
  int l2_bytes = 0;
  bool cluster_launch = false;
  int vmm = -1;        // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED; -1: unreadable
  int multicast = -1;  // CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED; -1: unreadable
};

struct Backend {
  std::string name;
  bool serves = false;
  std::string why;  // what it serves here, or why not
};

struct SystemInfo {
  std::string no_gpu_reason;  // empty when at least one GPU is visible
  int driver_version = 0;
  int runtime_version = 0;
  std::vector<GpuInfo> gpus;
  std::vector<std::vector<int>> peer_access;  // [i][j]: 1 if GPU i can access GPU j
  int nccl_version = 0;
  std::vector<Backend> backends;
};

SystemInfo query_system();

// Number of visible GPUs; 0 (never an exception) without a driver or device.
int visible_gpu_count(std::string* why = nullptr);

}  // namespace tpdecode
