#include "tpdecode/device_info.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "tpdecode/nccl_team.hpp"

namespace tpdecode {
namespace {

using GetAttribute = CUresult (*)(int*, CUdevice_attribute, CUdevice);

// Why: the driver library is absent on machines without a GPU; reach it through
// the runtime so the binary starts everywhere.
GetAttribute driver_get_attribute() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  if (cudaGetDriverEntryPointByVersion("cuDeviceGetAttribute", &fn, 12000, cudaEnableDefault, &status) != cudaSuccess ||
      status != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<GetAttribute>(fn);
}

int read_attribute(GetAttribute get, CUdevice_attribute a, int device) {
  int v = 0;
  if (!get || get(&v, a, device) != CUDA_SUCCESS) return -1;
  return v;
}

}  // namespace

int visible_gpu_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    int driver = 0;
    cudaDriverGetVersion(&driver);
    cudaGetLastError();
    if (why)
      *why = driver == 0 ? std::string("no NVIDIA driver is installed on this machine (no GPU to run on)")
                         : fmt::format("no CUDA GPU is usable here ({}: {})", cudaGetErrorName(e), cudaGetErrorString(e));
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA GPU is visible";
  return n;
}

SystemInfo query_system() {
  SystemInfo s;
  cudaRuntimeGetVersion(&s.runtime_version);
  cudaDriverGetVersion(&s.driver_version);
  cudaGetLastError();
  s.nccl_version = nccl_runtime_version();
  const int n = visible_gpu_count(&s.no_gpu_reason);
  const GetAttribute get = n > 0 ? driver_get_attribute() : nullptr;
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) continue;
    GpuInfo g;
    g.index = d;
    g.name = p.name;
    g.cc_major = p.major;
    g.cc_minor = p.minor;
    g.sms = p.multiProcessorCount;
    g.memory_bytes = p.totalGlobalMem;
    g.l2_bytes = p.l2CacheSize;
    int cluster = 0;
    cudaDeviceGetAttribute(&cluster, cudaDevAttrClusterLaunch, d);
    g.cluster_launch = cluster != 0;
    g.vmm = read_attribute(get, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, d);
    g.multicast = read_attribute(get, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, d);
    s.gpus.push_back(g);
  }
  s.peer_access.assign(static_cast<std::size_t>(n), std::vector<int>(static_cast<std::size_t>(n), 0));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      int can = i == j ? 1 : 0;
      if (i != j) cudaDeviceCanAccessPeer(&can, i, j);
      s.peer_access[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = can;
    }
  cudaGetLastError();

  const bool sm90 = !s.gpus.empty() && s.gpus[0].cc_major == 9;
  Backend local{"local team", false, ""};
  if (n == 0)
    local.why = s.no_gpu_reason;
  else if (!sm90)
    local.why = fmt::format("GPU 0 is sm_{}{}; the kernels are built for sm_90a", s.gpus[0].cc_major, s.gpus[0].cc_minor);
  else {
    local.serves = true;
    local.why = fmt::format("TP 1, 2, 4, 8, 16 emulated on GPU 0 (protocol checks; collectives limited by co-residency)");
  }
  s.backends.push_back(local);

  Backend nccl{"NCCL team", false, ""};
  std::string why;
  if (!nccl_team_available(&why))
    nccl.why = why;
  else if (n < 2)
    nccl.why = fmt::format("NCCL {}.{}.{} is usable, but {} GPU(s): mailbox collectives need 2 or more (a 1-rank "
                           "team runs only the stock path)", s.nccl_version / 10000, s.nccl_version / 100 % 100,
                           s.nccl_version % 100, n);
  else {
    bool all_peers = true;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) all_peers = all_peers && s.peer_access[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)];
    nccl.serves = all_peers;
    nccl.why = all_peers ? fmt::format("TP up to {} over peer stores (NVLink multicast is never used)", n)
                         : "not every GPU pair has peer access: the stock NCCL collectives only";
  }
  s.backends.push_back(nccl);
  Backend mc{"multicast (multimem)", false,
             "off by design: the transport is peer stores; multicast objects are never created"};
  s.backends.push_back(mc);
  return s;
}

}  // namespace tpdecode
