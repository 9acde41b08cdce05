#include "bench_timing.hpp"

#include <algorithm>

#include "tpdecode/error.hpp"

namespace tpdecode::bench {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Timing time_graph(cudaStream_t stream, const std::function<void(cudaStream_t, int)>& enqueue, int calls_per_replay,
                  int replays, int warmup) {
  cudaGraph_t graph = nullptr;
  TPD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    for (int c = 0; c < calls_per_replay; ++c) enqueue(stream, c);
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  TPD_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  TPD_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  TPD_CUDA(cudaEventCreate(&start));
  TPD_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) TPD_CUDA(cudaGraphLaunch(exec, stream));
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(replays));
  for (int i = 0; i < replays; ++i) {
    TPD_CUDA(cudaEventRecord(start, stream));
    TPD_CUDA(cudaGraphLaunch(exec, stream));
    TPD_CUDA(cudaEventRecord(stop, stream));
    TPD_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    TPD_CUDA(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(1000.0 * ms / calls_per_replay);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  Timing t;
  t.replays = replays;
  t.median_us = median(us);
  t.min_us = *std::min_element(us.begin(), us.end());
  t.max_us = *std::max_element(us.begin(), us.end());
  return t;
}

}  // namespace tpdecode::bench
