// The streams of one call's driven ranks: each rank its own. Why: a rank's kernel
// waits for its peers' arrivals, so a peer queued behind it on the same stream never
// arrives (a certain TimeoutError and an aborted team instead of an argument error).
// The legacy default stream is such a stream for every rank: it waits for the work
// of every blocking stream of its device and they for it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>

#include "core/check.hpp"

namespace tpdecode {

// InvalidArgument naming the first two driven ranks given the same stream, or a
// driven rank of two or more given the legacy default stream (0 or cudaStreamLegacy).
inline void check_distinct_streams(std::span<const cudaStream_t> streams, const char* op) {
  if (streams.size() < 2) return;
  for (std::size_t i = 0; i < streams.size(); ++i) {
    check(streams[i] != nullptr && streams[i] != cudaStreamLegacy,
          "{}: driven rank {} was given the legacy default stream, which waits for the other ranks' blocking streams "
          "and they for it (give each driven rank a non-blocking stream of its own)",
          op, i);
    for (std::size_t j = i + 1; j < streams.size(); ++j)
      check(streams[i] != streams[j],
            "{}: driven ranks {} and {} were given the same stream (each rank's work needs a stream of its own)", op,
            i, j);
  }
}

}  // namespace tpdecode
