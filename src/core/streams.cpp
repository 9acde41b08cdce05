#include "tpdecode/streams.hpp"

#include <mutex>

#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

// A pool of events, made once per process (events may be re-recorded, also
// during capture). Guarded: several host threads may fork at once.
cudaEvent_t pooled_event(std::size_t i) {
  static std::mutex m;
  static std::vector<cudaEvent_t> events;
  std::lock_guard<std::mutex> lock(m);
  while (events.size() <= i) {
    cudaEvent_t e;
    TPD_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events.push_back(e);
  }
  return events[i];
}

}  // namespace

void fork_streams(cudaStream_t origin, const std::vector<cudaStream_t>& others) {
  cudaEvent_t e = pooled_event(0);
  TPD_CUDA(cudaEventRecord(e, origin));
  for (cudaStream_t s : others)
    if (s != origin) TPD_CUDA(cudaStreamWaitEvent(s, e, 0));
}

void join_streams(cudaStream_t origin, const std::vector<cudaStream_t>& others) {
  for (std::size_t i = 0; i < others.size(); ++i) {
    if (others[i] == origin) continue;
    cudaEvent_t e = pooled_event(i + 1);
    TPD_CUDA(cudaEventRecord(e, others[i]));
    TPD_CUDA(cudaStreamWaitEvent(origin, e, 0));
  }
}

}  // namespace tpdecode
