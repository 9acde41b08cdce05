// Timing for the benchmarks: capture work into a CUDA graph, replay it many times,
// time each replay with CUDA events, report the median.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <vector>

namespace tpdecode::bench {

struct Timing {
  double median_us = 0;  // per call (a replay's time / calls_per_replay)
  double min_us = 0;
  double max_us = 0;
  int replays = 0;
};

// `enqueue(stream)` puts one call's work on `stream` (it may fork to other streams
// with tpdecode::fork_streams, as long as it joins back). The graph holds `calls_per_replay`
// consecutive calls; `enqueue` receives the call index so it can rotate inputs.
// Warm-up replays are not timed.
Timing time_graph(cudaStream_t stream, const std::function<void(cudaStream_t, int call)>& enqueue,
                  int calls_per_replay, int replays, int warmup = 3);

// Median of a sample (sorted copy).
double median(std::vector<double> v);

}  // namespace tpdecode::bench
