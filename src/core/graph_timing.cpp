#include "core/graph_timing.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "tpdecode/error.hpp"

namespace tpdecode {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

// This thread's timing streams not in use, by device. Why kept rather than made per
// timing: a stream is the key of its cuBLAS workspace (CublasContext), so a stream
// per timing would leave a workspace per timing.
struct IdleTimingStreams {
  std::vector<std::pair<int, cudaStream_t>> streams;
  ~IdleTimingStreams() {
    for (const auto& [device, s] : streams) cudaStreamDestroy(s);
  }
};
thread_local IdleTimingStreams idle_timing_streams;

}  // namespace

TimingStream::TimingStream() {
  TPD_CUDA(cudaGetDevice(&device_));
  auto& idle = idle_timing_streams.streams;
  const auto it = std::find_if(idle.begin(), idle.end(), [&](const auto& e) { return e.first == device_; });
  if (it != idle.end()) {
    s_ = it->second;
    idle.erase(it);
  } else {
    TPD_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
  }
}

TimingStream::~TimingStream() {
  cudaStreamSynchronize(s_);
  idle_timing_streams.streams.emplace_back(device_, s_);
}

TimedGraph::Exec::~Exec() {
  if (h) cudaGraphExecDestroy(h);
}
TimedGraph::Event::Event() { TPD_CUDA(cudaEventCreate(&h)); }
TimedGraph::Event::~Event() { cudaEventDestroy(h); }

TimedGraph::TimedGraph(cudaStream_t stream, const GraphCall& enqueue, int calls) : calls_(calls) {
  cudaGraph_t graph = nullptr;
  TPD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    for (int c = 0; c < calls; ++c) enqueue(stream, c);
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  TPD_CUDA(cudaStreamEndCapture(stream, &graph));
  const cudaError_t e = cudaGraphInstantiate(&exec_.h, graph, 0);
  cudaGraphDestroy(graph);
  TPD_CUDA(e);
}

void TimedGraph::launch(cudaStream_t stream) const { TPD_CUDA(cudaGraphLaunch(exec_.h, stream)); }

double TimedGraph::time_replay(cudaStream_t stream) {
  TPD_CUDA(cudaEventRecord(start_.h, stream));
  TPD_CUDA(cudaGraphLaunch(exec_.h, stream));
  TPD_CUDA(cudaEventRecord(stop_.h, stream));
  TPD_CUDA(cudaEventSynchronize(stop_.h));
  float ms = 0;
  TPD_CUDA(cudaEventElapsedTime(&ms, start_.h, stop_.h));
  us_.push_back(1000.0 * ms / calls_);
  return us_.back();
}

GraphTiming TimedGraph::timing() const {
  GraphTiming t;
  t.replays = static_cast<int>(us_.size());
  if (us_.empty()) return t;
  t.median_us = median(us_);
  t.min_us = *std::min_element(us_.begin(), us_.end());
  t.max_us = *std::max_element(us_.begin(), us_.end());
  return t;
}

std::vector<std::vector<double>> interleave(std::size_t n, int replays,
                                            const std::function<double(std::size_t index)>& replay) {
  std::vector<std::vector<double>> out(n);
  for (int r = 0; r < replays; ++r)
    for (std::size_t i = 0; i < n; ++i) out[i].push_back(replay(i));
  return out;
}

GraphTiming time_graph(cudaStream_t stream, const GraphCall& enqueue, int calls, int replays, int warmup) {
  TimedGraph g(stream, enqueue, calls);
  for (int i = 0; i < warmup; ++i) g.launch(stream);
  for (int i = 0; i < replays; ++i) g.time_replay(stream);
  return g.timing();
}

}  // namespace tpdecode
