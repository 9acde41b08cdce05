// Built when NCCL >= 2.28.9 is not found: the NCCL team reports why.
#include "tpdecode/error.hpp"
#include "tpdecode/nccl_team.hpp"

#ifndef TPDECODE_NCCL_REASON
#define TPDECODE_NCCL_REASON "NCCL >= 2.28.9 was not found at build time"
#endif

namespace tpdecode {

bool nccl_team_available(std::string* why) {
  if (why) *why = TPDECODE_NCCL_REASON;
  return false;
}

int nccl_runtime_version() { return 0; }

NcclUniqueId NcclTeam::make_unique_id() { throw Unavailable(TPDECODE_NCCL_REASON); }

NcclTeam::NcclTeam(ncclComm*, int, const TeamOptions& options) : Team(1, options) {
  throw Unavailable(TPDECODE_NCCL_REASON);
}
NcclTeam::NcclTeam(const NcclUniqueId&, int, int, int, const TeamOptions& options) : Team(1, options) {
  throw Unavailable(TPDECODE_NCCL_REASON);
}
NcclTeam::~NcclTeam() = default;
std::string NcclTeam::describe() const { return "NCCL team (unavailable)"; }
void NcclTeam::run_threads(const std::vector<int>&, const std::function<void(NcclTeam&)>&, const TeamOptions&) {
  throw Unavailable(TPDECODE_NCCL_REASON);
}
void NcclTeam::all_reduce_bf16(const void*, void*, std::size_t, cudaStream_t) const {}
void NcclTeam::all_gather_bytes(const void*, void*, std::size_t, cudaStream_t) const {}
void NcclTeam::broadcast_bytes(void*, std::size_t, cudaStream_t) const {}
GemmAgreement NcclTeam::gemm_agreement() { return {}; }
void NcclTeam::init(int, int) {}
void NcclTeam::allocate_symmetric(std::size_t, std::vector<void*>&, std::vector<PeerPointers>&) {}
void NcclTeam::free_symmetric(const std::vector<void*>&) {}
void NcclTeam::barrier(std::chrono::milliseconds) {}
void NcclTeam::gather_host(const void*, std::size_t, void*, std::chrono::milliseconds) {}
void NcclTeam::on_stuck(int, const std::string&) {}
void NcclTeam::settle(const char*, std::chrono::milliseconds) const {}
ncclComm* NcclTeam::live_comm() const { throw Unavailable(TPDECODE_NCCL_REASON); }
void NcclTeam::abort_comm(const std::string& why) const { throw TeamBroken(why); }

}  // namespace tpdecode
