#include "tpdecode/local_team.hpp"

#include <fmt/format.h>

#include "tpdecode/error.hpp"

namespace tpdecode {

LocalTeam::LocalTeam(int size, int device, const TeamOptions& options) : Team(size, options), device_(device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw Unavailable("the local team needs a CUDA GPU; none is visible");
  }
  require(device >= 0 && device < count, fmt::format("device {} does not exist ({} visible)", device, count));
  TPD_CUDA(cudaSetDevice(device));
  std::vector<RankContext> contexts(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    RankContext& c = contexts[static_cast<std::size_t>(r)];
    c.rank = r;
    c.device = device;
    c.ranks_on_device = size;
    TPD_CUDA(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  }
  init_contexts(std::move(contexts));
}

LocalTeam::~LocalTeam() {
  cudaSetDevice(device_);
  cudaDeviceSynchronize();
  release_all();
  for (int i = 0; i < driven(); ++i) cudaStreamDestroy(rank_context(i).stream);
}

std::string LocalTeam::describe() const {
  return fmt::format("local team: {} ranks emulated on GPU {}", size(), device_);
}

void LocalTeam::allocate_symmetric(std::size_t bytes, std::vector<void*>& local, std::vector<PeerPointers>& peers) {
  TPD_CUDA(cudaSetDevice(device_));
  PeerPointers all;
  for (int r = 0; r < size(); ++r) {
    TPD_CUDA(cudaMalloc(&all.base[r], bytes));
    local[static_cast<std::size_t>(r)] = all.base[r];
  }
  for (PeerPointers& p : peers) p = all;
}

void LocalTeam::free_symmetric(const std::vector<void*>& local) {
  for (void* p : local) cudaFree(p);
}

void LocalTeam::barrier() { TPD_CUDA(cudaDeviceSynchronize()); }

}  // namespace tpdecode
