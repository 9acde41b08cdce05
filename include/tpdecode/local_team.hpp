// N emulated ranks on one GPU: each rank has its own copy of every symmetric
// buffer in that GPU's memory and its own stream; the ranks' kernels run
// concurrently, so the whole mailbox protocol (races, epochs, re-arm, abort) is
// exercised on one device. It cannot show cross-GPU memory ordering: stores between
// SMs of one GPU are ordered more strongly than stores over NVLink.
#pragma once

#include "tpdecode/team.hpp"

namespace tpdecode {

class LocalTeam final : public Team {
 public:
  LocalTeam(int size, int device = 0, const TeamOptions& options = {});
  ~LocalTeam() override;

  TeamKind kind() const override { return TeamKind::kLocal; }
  std::string describe() const override;

 private:
  void allocate_symmetric(std::size_t bytes, std::vector<void*>& local, std::vector<PeerPointers>& peers) override;
  void free_symmetric(const std::vector<void*>& local) override;
  void barrier(std::chrono::milliseconds limit) override;
  void gather_host(const void* mine, std::size_t bytes, void* all, std::chrono::milliseconds limit) override;
  void on_stuck(int driven, const std::string& what) override;
  int device_;
};

}  // namespace tpdecode
