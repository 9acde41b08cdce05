#include "tpdecode/local_team.hpp"

#include <cstring>

#include "core/check.hpp"
#include "team/rank_context.hpp"

namespace tpdecode {

LocalTeam::LocalTeam(int size, int device, const TeamOptions& options) : Team(size, options), device_(device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw Unavailable("the local team needs a CUDA GPU; none is visible");
  }
  check(device >= 0 && device < count, "device {} does not exist ({} visible)", device, count);
  TPD_CUDA(cudaSetDevice(device));
  std::vector<RankContext> contexts(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    RankContext& c = contexts[static_cast<std::size_t>(r)];
    c.rank = r;
    c.device = device;
    c.ranks_on_device = size;
    TPD_CUDA(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  }
  init_contexts(contexts, true);
}

LocalTeam::~LocalTeam() {
  cudaSetDevice(device_);
  cudaDeviceSynchronize();
  release_all();
  for (int i = 0; i < driven(); ++i) cudaStreamDestroy(stream(i));
}

std::string LocalTeam::describe() const { return fmt::format("local team: {} ranks emulated on GPU {}", size(), device_); }

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

// Why no wait: one host thread drives every rank, so every rank is here; the
// device synchronisation makes each rank's fills visible to the others.
void LocalTeam::barrier(std::chrono::milliseconds) { TPD_CUDA(cudaDeviceSynchronize()); }

// Why a copy: one object builds every rank's objects, so every rank's `mine` is this one.
void LocalTeam::gather_host(const void* mine, std::size_t bytes, void* all, std::chrono::milliseconds) {
  for (int r = 0; r < size(); ++r)
    std::memcpy(static_cast<char*>(all) + static_cast<std::size_t>(r) * bytes, mine, bytes);
}

// Every wait of the local team's kernels is bounded, so a stream that does not
// drain means a kernel outside tpdecode holds it: nothing tpdecode can end.
void LocalTeam::on_stuck(int, const std::string& what) { throw TeamBroken(what); }

}  // namespace tpdecode
