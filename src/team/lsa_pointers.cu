#include <nccl_device.h>

#include "team/lsa_pointers.hpp"
#include "tpdecode/error.hpp"

#include <functional>
#include <string>

namespace tpdecode {
namespace {

__global__ void lsa_pointers_kernel(ncclWindow_t window, int size, PeerPointers* out) {
  for (int peer = 0; peer < size; ++peer) out->base[peer] = ncclGetLsaPointer(window, 0, peer);
}

}  // namespace

int lsa_team_size(ncclComm_t comm, const std::function<void(const char*)>& settle) {
  // lsaMultimem stays false: never multicast.
#ifdef NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER
  ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;  // releases that version the struct
#else
  ncclDevCommRequirements reqs = {};
#endif
  ncclDevComm dev = {};
  const ncclResult_t r = ncclDevCommCreate(comm, &reqs, &dev);
  if (r != ncclSuccess && r != ncclInProgress)
    throw Error(std::string("ncclDevCommCreate failed: ") + ncclGetErrorString(r));
  settle("device communicator creation");
  const int size = dev.lsaSize;
  ncclDevCommDestroy(comm, &dev);
  settle("device communicator destruction");
  return size;
}

PeerPointers read_lsa_pointers(ncclWindow_t window, int size, cudaStream_t stream) {
  PeerPointers* table = nullptr;
  TPD_CUDA(cudaMalloc(&table, sizeof(PeerPointers)));
  lsa_pointers_kernel<<<1, 1, 0, stream>>>(window, size, table);
  PeerPointers host;
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpyAsync(&host, table, sizeof host, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  cudaFree(table);
  TPD_CUDA(e);
  return host;
}

}  // namespace tpdecode
