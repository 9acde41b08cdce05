// One rank of an NCCL communicator on its own GPU (one thread or process per
// GPU). Symmetric buffers come from ncclMemAlloc + a symmetric window
// (NCCL_WIN_COLL_SYMMETRIC); each peer's address is read once through
// ncclGetLsaPointer. The same communicator runs the stock collectives.
// NVLink multicast is never used: NCCL_NVLS_ENABLE=0 is set before the
// communicator is made, and the transport is peer stores.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <vector>

#include "tpdecode/team.hpp"

struct ncclComm;

namespace tpdecode {

using NcclUniqueId = std::array<char, 128>;

// Whether this build and machine can make NCCL teams; `why` says why not.
bool nccl_team_available(std::string* why);
// NCCL's runtime version code (e.g. 22809), or 0 without NCCL.
int nccl_runtime_version();

class NcclTeam final : public Team {
 public:
  // A rank of the caller's communicator (the caller keeps and destroys it).
  NcclTeam(ncclComm* comm, int device, const TeamOptions& options = {});
  // Makes rank `rank` of `size` from `id` (from make_unique_id on one rank).
  NcclTeam(const NcclUniqueId& id, int rank, int size, int device, const TeamOptions& options = {});
  ~NcclTeam() override;

  static NcclUniqueId make_unique_id();
  // One process, one thread per GPU: builds a team of devices.size() ranks and
  // runs fn on each rank's thread; rethrows the first failure.
  static void run_threads(const std::vector<int>& devices, const std::function<void(NcclTeam&)>& fn,
                          const TeamOptions& options = {});

  TeamKind kind() const override { return TeamKind::kNccl; }
  std::string describe() const override;
  ncclComm* comm() const { return comm_; }
  int rank() const { return rank_context(0).rank; }
  int device() const { return rank_context(0).device; }

  // Stock collectives on this rank's stream (or `stream`).
  void all_reduce_bf16(const void* in, void* out, std::size_t count, cudaStream_t stream) const;
  void all_gather_bytes(const void* in, void* out, std::size_t bytes_per_rank, cudaStream_t stream) const;

 private:
  void init(int device);
  void allocate_symmetric(std::size_t bytes, std::vector<void*>& local,
                          std::vector<PeerPointers>& peers) override;
  void free_symmetric(const std::vector<void*>& local) override;
  void barrier() override;

  ncclComm* comm_ = nullptr;
  bool owns_comm_ = false;
  int* barrier_word_ = nullptr;
  std::vector<std::pair<void*, void*>> windows_;  // (buffer, ncclWindow_t)
};

}  // namespace tpdecode
