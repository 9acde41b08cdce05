// How tpdecode times GPU work, in the tuner and in every benchmark: capture N
// consecutive calls into one CUDA graph, replay it (warm-up replays untimed), time
// each replay with CUDA events, and report per-call microseconds (median, min, max).
// Why graphs: launch overhead stays out of the figure, as in a decode step's graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <vector>

namespace tpdecode {

struct GraphTiming {
  double median_us = 0;  // per call: a replay's time / the calls it holds
  double min_us = 0;
  double max_us = 0;
  int replays = 0;  // timed
};

// `enqueue(stream, call)` puts one call's work on `stream` (it may fork to other
// streams, joining back before it returns); `call` (0 .. calls - 1) lets it rotate
// inputs.
using GraphCall = std::function<void(cudaStream_t stream, int call)>;

// One captured graph of `calls` consecutive calls, and the times of its replays.
// Capture failures throw (the capture is ended, nothing leaks).
class TimedGraph {
 public:
  TimedGraph(cudaStream_t stream, const GraphCall& enqueue, int calls);
  TimedGraph(const TimedGraph&) = delete;
  TimedGraph& operator=(const TimedGraph&) = delete;

  // An untimed replay (warm-up; the caller may check its outputs).
  void launch(cudaStream_t stream) const;
  // A timed replay: waits for it and records its time per call.
  double time_replay(cudaStream_t stream);
  // Over the timed replays so far.
  GraphTiming timing() const;

 private:
  struct Exec {
    cudaGraphExec_t h = nullptr;
    ~Exec();
  };
  struct Event {
    cudaEvent_t h = nullptr;
    Event();
    ~Event();
  };
  Event start_, stop_;
  Exec exec_;
  int calls_;
  std::vector<double> us_;  // per timed replay, per call
};

// `replays` rounds of replay(0), replay(1), ..., replay(n - 1) (A B C A B C ...),
// so clock or thermal drift over the call falls on every index alike; per index,
// what its calls returned, in order. How the tuner times candidates.
std::vector<std::vector<double>> interleave(std::size_t n, int replays,
                                            const std::function<double(std::size_t index)>& replay);

// Captures, replays `warmup` times untimed, then `replays` times timed.
GraphTiming time_graph(cudaStream_t stream, const GraphCall& enqueue, int calls, int replays, int warmup = 3);

// Median of a sample (0 for none).
double median(std::vector<double> v);

// A non-blocking stream of the timing code's own (a capture cannot run on the legacy
// default stream, nor on a caller's stream mid-use); its work ends before it goes.
// The thread keeps it for its next timing on the device (its cuBLAS workspace too).
class TimingStream {
 public:
  TimingStream();
  ~TimingStream();
  TimingStream(const TimingStream&) = delete;
  TimingStream& operator=(const TimingStream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
  int device_ = 0;
};

}  // namespace tpdecode
