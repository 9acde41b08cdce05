// One rank of an NCCL team on its own GPU (one thread or process per GPU).
//
// tpdecode runs on a communicator of its own, made non-blocking so every wait has a
// deadline: from your communicator it splits one (yours is never used for anything
// else, and stays healthy whatever happens to tpdecode's), or it makes one from a
// unique id. Symmetric buffers come from ncclMemAlloc + a symmetric window
// (NCCL_WIN_COLL_SYMMETRIC); each peer's address is read once through
// ncclGetLsaPointer. Ranks that do not all share one NVLink domain make a team
// whose collectives all run through NCCL (Team::shares_memory() is false).
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

// Whether this build and machine can make NCCL teams; `why` says why not (among the
// reasons: a runtime older than 2.28.9, or of another release than the headers this
// build was compiled with: see nccl_versions_match).
bool nccl_team_available(std::string* why);
// Whether NCCL version codes (e.g. 22809) are one release (major.minor): the device
// API's structs are compiled in and change between releases.
constexpr bool nccl_versions_match(int runtime, int built) { return runtime / 100 == built / 100; }
// NCCL's runtime version code (e.g. 22809), or 0 without NCCL.
int nccl_runtime_version();

class NcclTeam final : public Team {
 public:
  // Collective over `parent`'s ranks: splits a communicator for tpdecode from
  // yours (you keep and destroy yours; tpdecode never uses it again).
  NcclTeam(ncclComm* parent, int device, const TeamOptions& options = {});
  // Makes rank `rank` of `size` from `id` (from make_unique_id on one rank).
  NcclTeam(const NcclUniqueId& id, int rank, int size, int device, const TeamOptions& options = {});
  // Collective (every rank). Frees the symmetric buffers once the team's own stream
  // has drained, not yours: synchronize(limit, your streams) first where calls or
  // graph replays may still be queued on them.
  ~NcclTeam() override;

  static NcclUniqueId make_unique_id();
  // One process, one thread per GPU: builds a team of devices.size() ranks and
  // runs fn on each rank's thread; rethrows the first failure.
  static void run_threads(const std::vector<int>& devices, const std::function<void(NcclTeam&)>& fn,
                          const TeamOptions& options = {});

  TeamKind kind() const override { return TeamKind::kNccl; }
  std::string describe() const override;
  // Whether the communicator was aborted (the team is then unusable).
  bool broken() const override { return comm_ == nullptr; }

  // Stock collectives on `stream` (the enqueue is bounded by the team's timeout).
  void all_reduce_bf16(const void* in, void* out, std::size_t count, cudaStream_t stream) const;
  void all_gather_bytes(const void* in, void* out, std::size_t bytes_per_rank, cudaStream_t stream) const;
  // Rank 0's `bytes` at `data` (device memory) on every rank, on `stream`.
  void broadcast_bytes(void* data, std::size_t bytes, cudaStream_t stream) const;
  // Rank 0's decision, broadcast (collective: every rank calls it at the same point,
  // eager, bounded by the team's timeout).
  GemmAgreement gemm_agreement() override;

 private:
  void init(int rank, int device);
  void allocate_symmetric(std::size_t bytes, std::vector<void*>& local, std::vector<PeerPointers>& peers) override;
  void free_symmetric(const std::vector<void*>& local) override;
  void barrier(std::chrono::milliseconds limit) override;
  void gather_host(const void* mine, std::size_t bytes, void* all, std::chrono::milliseconds limit) override;
  void on_stuck(int driven, const std::string& what) override;
  // Waits for the communicator's pending operation (non-blocking mode), at most
  // `limit`; aborts the communicator and throws TeamBroken past it. Collective
  // operations (creation, window registration) wait as long as a barrier.
  void settle(const char* what, std::chrono::milliseconds limit) const;
  [[noreturn]] void abort_comm(const std::string& why) const;
  // The communicator; TeamBroken once it was aborted (NCCL would answer a null
  // communicator with a bare argument error).
  ncclComm* live_comm() const;
  // Waits for the team's stream, where the last collective was queued, until
  // `until`; aborts the communicator and throws TeamBroken past it.
  void await_peers(const char* what, std::chrono::steady_clock::time_point until, std::chrono::milliseconds limit);

  mutable ncclComm* comm_ = nullptr;
  int* barrier_word_ = nullptr;
  std::vector<std::pair<void*, void*>> windows_;  // (buffer, ncclWindow_t)
};

}  // namespace tpdecode
