// Fork work from one stream to several and join it back with events: how the local
// team's ranks (one stream each) run inside one CUDA graph capture.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

namespace tpdecode {

// The streams must belong to the calling thread's current device; several host
// threads may fork and join at once (each uses its own events).
// Every stream in `others` waits for the work enqueued so far on `origin`.
void fork_streams(cudaStream_t origin, const std::vector<cudaStream_t>& others);
// `origin` waits for the work enqueued so far on every stream in `others`.
void join_streams(cudaStream_t origin, const std::vector<cudaStream_t>& others);

}  // namespace tpdecode
