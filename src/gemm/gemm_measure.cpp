#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "core/bf16.hpp"
#include "core/check.hpp"
#include "core/graph_timing.hpp"
#include "core/random_fill.hpp"
#include "core/weight_rotation.hpp"
#include "gemm/gemm_paths.hpp"
#include "tpdecode/device_buffer.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

// How candidates are timed, and why (weight copies: weight_rotation.hpp).
constexpr double kGraphBytes = 384e6;  // weight bytes per timed graph (~85 us at 4.5 TB/s): the events'
                                       // ~0.5 us resolution stays below 1 %
constexpr int kMaxCalls = 64;          // calls per graph at most (the smallest weights)
constexpr int kMinCalls = 4;           // calls per graph at least: with one or two, a graph's launch and
                                       // its first kernel's ramp weigh in the time (the largest weights)
constexpr int kRounds = 5;             // timed replays per candidate in each pass of the tuner (tune_rule.hpp)
constexpr int kRoundsLarge = 3;        // where one graph streams more than kLargeGraphBytes
constexpr double kLargeGraphBytes = 1e9;  // (keeps the largest weights near 50 ms of tuning)
// A candidate whose output is farther than this from cuBLAS's (relative, Frobenius)
// is wrong and never chosen. Both round once to BF16 from FP32 sums: they differ by
// ~1e-3; a wrong sum or an unwritten element is O(1) or NaN.
constexpr double kMismatch = 2e-2;

// ||a - ref|| / ||ref|| over BF16 values (0 where ref is all zeros; NaN propagates).
double distance(const std::vector<uint16_t>& a, const std::vector<uint16_t>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double r = bf16::to_float(ref[i]);
    const double d = bf16::to_float(a[i]) - r;
    num += d * d;
    den += r * r;
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

// The candidates' graphs over rotating copies of the weight, made and checked once;
// timed as the tuner asks. Members in this order: the capture mode is restored
// last, after the graphs, buffers and stream are gone.
class PathTiming final : public GemmTiming {
 public:
  PathTiming(const std::vector<GemmDecision>& candidates, const TensorView& weight, int m, CublasContext& ctx, bool pdl,
             cudaStream_t stream, const GemmWarning& warn);
  std::vector<std::vector<double>> time(const std::vector<std::size_t>& which, int replays) override;
  int replays() const override { return replays_; }

 private:
  RelaxedCaptureMode relaxed_;
  TimingStream s_;
  DeviceBuffer pool_, x_, out_;
  std::vector<std::optional<TimedGraph>> graphs_;
  int replays_ = kRounds;
};

PathTiming::PathTiming(const std::vector<GemmDecision>& candidates, const TensorView& weight, int m,
                       CublasContext& ctx, bool pdl, cudaStream_t stream, const GemmWarning& warn) {
  TPD_CUDA(cudaStreamSynchronize(stream));
  const int64_t n = weight.rows;
  const int64_t k = weight.cols;
  const std::size_t bytes = static_cast<std::size_t>(n * k) * 2;
  int device = 0, l2 = 0;
  TPD_CUDA(cudaGetDevice(&device));
  TPD_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  int copies = weight_copies(bytes, static_cast<std::size_t>(l2));
  if (copies > 1) {  // pool_: [copies - 1, N, K] bf16, copies of the weight
    try {
      pool_ = DeviceBuffer(bytes * static_cast<std::size_t>(copies - 1));
    } catch (const CudaError&) {  // short of memory: the weight alone (L2 may flatter small ones)
      cudaGetLastError();
      copies = 1;
    }
  }
  for (int c = 1; c < copies; ++c)
    TPD_CUDA(cudaMemcpyAsync(pool_.as<char>() + bytes * static_cast<std::size_t>(c - 1), weight.data, bytes,
                             cudaMemcpyDeviceToDevice, s_.get()));
  x_ = DeviceBuffer(static_cast<std::size_t>(m * k) * 2);
  out_ = DeviceBuffer(static_cast<std::size_t>(m * n) * 2);
  fill_uniform_bf16(x_.get(), m * k, 0x7e57, 1.0f, s_.get());
  const TensorView xv = TensorView::bf16(x_.get(), m, k);
  const TensorView ov = TensorView::bf16(out_.get(), m, n);
  char* const pool = pool_.as<char>();
  auto copy = [=](int c) {
    return c % copies == 0 ? weight : TensorView::bf16(pool + bytes * static_cast<std::size_t>(c % copies - 1), n, k);
  };
  const int calls = rotation_calls(
      copies, std::clamp(static_cast<int>(std::ceil(kGraphBytes / static_cast<double>(bytes))), kMinCalls, kMaxCalls));
  replays_ = static_cast<double>(bytes) * calls > kLargeGraphBytes ? kRoundsLarge : kRounds;

  // A candidate that cannot be prepared, captured or run, or whose output is not
  // cuBLAS's, is marked failed (no graph: never timed). cuBLAS runs first: its
  // output is the reference (every call of a graph computes the same product: the
  // copies are the same bytes).
  std::vector<std::size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_partition(order.begin(), order.end(),
                        [&](std::size_t i) { return candidates[i].path == GemmPath::kCublas; });
  std::vector<uint16_t> reference, got(static_cast<std::size_t>(m * n));
  graphs_ = std::vector<std::optional<TimedGraph>>(candidates.size());  // made in place: a TimedGraph never moves
  for (std::size_t i : order) {
    try {
      const GemmDecision launched = prepare_path(candidates[i], weight, m);
      graphs_[i].emplace(
          s_.get(), [&](cudaStream_t st, int c) { launch_path(launched, copy(c), xv, ov, ctx, pdl, st); }, calls);
      TPD_CUDA(cudaMemsetAsync(out_.get(), 0xff, out_.bytes(), s_.get()));  // NaN: an unwritten element shows
      graphs_[i]->launch(s_.get());                                         // warm-up
      TPD_CUDA(cudaMemcpyAsync(got.data(), out_.get(), out_.bytes(), cudaMemcpyDeviceToHost, s_.get()));
      TPD_CUDA(cudaStreamSynchronize(s_.get()));
      if (reference.empty() && candidates[i].path == GemmPath::kCublas) {
        reference = got;
      } else if (const double d = reference.empty() ? 0.0 : distance(got, reference); !(d <= kMismatch)) {
        warn(fmt::format("decode gemm tuning: {} on {}x{} at {} rows is {:.3g} (relative) from cuBLAS's result; "
                         "never chosen",
                         describe(candidates[i]), n, k, m, d));
        throw Error("wrong result");
      }
    } catch (const Error&) {
      cudaGetLastError();
      graphs_[i].reset();
    }
  }
}

std::vector<std::vector<double>> PathTiming::time(const std::vector<std::size_t>& which, int replays) {
  for (std::size_t i : which) check(i < graphs_.size(), "decode gemm tuning: candidate {} of {}", i, graphs_.size());
  std::vector<std::size_t> timed;  // the entries of `which` with a graph
  for (std::size_t w = 0; w < which.size(); ++w)
    if (graphs_[which[w]]) timed.push_back(w);
  const std::vector<std::vector<double>> us =
      interleave(timed.size(), replays, [&](std::size_t t) { return graphs_[which[timed[t]]]->time_replay(s_.get()); });
  std::vector<std::vector<double>> result(which.size());
  for (std::size_t t = 0; t < timed.size(); ++t) result[timed[t]] = us[t];
  return result;
}

}  // namespace

std::unique_ptr<GemmTiming> time_paths(const std::vector<GemmDecision>& candidates, const TensorView& weight, int m,
                                       CublasContext& ctx, bool pdl, cudaStream_t stream, const GemmWarning& warn) {
  return std::make_unique<PathTiming>(candidates, weight, m, ctx, pdl, stream, warn);
}

}  // namespace tpdecode
