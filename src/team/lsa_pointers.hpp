#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>

#include "tpdecode/team.hpp"

namespace tpdecode {

// Every peer's address of a symmetric window, read once on the device through
// ncclGetLsaPointer (the window handle is device memory).
// Ranks of `comm` that share load/store memory with this one (its LSA team), read
// off a device communicator made without requirements (no multimem). `settle` waits
// for the non-blocking communicator's pending operation.
int lsa_team_size(ncclComm_t comm, const std::function<void(const char*)>& settle);

PeerPointers read_lsa_pointers(ncclWindow_t window, int size, cudaStream_t stream);

}  // namespace tpdecode
