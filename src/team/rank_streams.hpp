// The streams of one call's driven ranks: each rank its own. Why: a rank's kernel
// waits for its peers' arrivals, so a peer queued behind it on the same stream never
// arrives (a certain TimeoutError and an aborted team instead of an argument error).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>

#include "core/check.hpp"

namespace tpdecode {

// InvalidArgument naming the first two driven ranks given the same stream.
inline void check_distinct_streams(std::span<const cudaStream_t> streams, const char* op) {
  for (std::size_t i = 0; i < streams.size(); ++i)
    for (std::size_t j = i + 1; j < streams.size(); ++j)
      check(streams[i] != streams[j],
            "{}: driven ranks {} and {} were given the same stream (each rank's work needs a stream of its own)", op,
            i, j);
}

}  // namespace tpdecode
