// Ranks as threads agreeing on rank 0's value, as an NCCL broadcast would (the CPU
// tests of decisions every rank of a team must share).
#pragma once

#include <condition_variable>
#include <mutex>
#include <optional>

namespace tpdecode::test {

template <class T>
struct Rank0Broadcast {
  std::mutex mutex;
  std::condition_variable cv;
  std::optional<T> root;
  T exchange(int rank, const T& mine) {
    std::unique_lock lock(mutex);
    if (rank == 0) {
      root = mine;
      cv.notify_all();
    }
    cv.wait(lock, [&] { return root.has_value(); });
    return *root;
  }
};

}  // namespace tpdecode::test
