#include "core/streams.hpp"

#include <map>
#include <utility>

#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

// Events made once per (host thread, device) and re-recorded, also during capture.
// Why per thread and device: an event belongs to the device it was made on, and two
// threads (the NCCL team's ranks) capturing at once must never record or wait on
// the same event, or one capture would reach into the other.
// A thread's events, destroyed when the thread ends (a pool of short-lived threads
// would otherwise leave theirs behind; at exit the runtime may already be gone, and
// what it answers then does not matter).
struct ThreadEvents {
  std::map<std::pair<int, std::size_t>, cudaEvent_t> events;
  ~ThreadEvents() {
    for (const auto& [key, e] : events) cudaEventDestroy(e);
  }
};

cudaEvent_t pooled_event(std::size_t i) {
  thread_local ThreadEvents pool;
  int device = 0;
  TPD_CUDA(cudaGetDevice(&device));
  cudaEvent_t& e = pool.events[{device, i}];
  if (!e) TPD_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

bool only(cudaStream_t origin, const std::vector<cudaStream_t>& others) {
  for (cudaStream_t s : others)
    if (s != origin) return false;
  return true;
}

}  // namespace

void fork_streams(cudaStream_t origin, const std::vector<cudaStream_t>& others) {
  if (only(origin, others)) return;
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
