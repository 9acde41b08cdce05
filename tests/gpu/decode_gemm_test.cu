// DecodeGemm on the GPU: both engines (every stream-K variant, the warp split-K)
// against an FP64 reference (no worse than cuBLAS on the same inputs, plus a stated
// slack), bitwise repeatable, every output element written, graph capture and
// replay, chains with true dependencies under programmatic dependent launch, the
// tuner on the real GPU (decides, reuses, agrees across ranks), the cuBLAS
// fallback for what no engine takes, and bad input refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_test_util.hpp"
#include "tpdecode/bf16.hpp"
#include "tpdecode/decode_gemm.hpp"
#include "tpdecode/random_fill.hpp"
#include "tpdecode/reference/gemm.hpp"

namespace tpdecode {
namespace {

using test::DeviceBuffer;

bool quick() { return std::getenv("TPDECODE_QUICK") != nullptr; }

// Error slack: the engine's relative error (vs FP64) may exceed cuBLAS's by 10 %
// of it plus 1e-5. Both accumulate in FP32 and round once to BF16, so both errors
// are the BF16 rounding (~1e-3); a wrong sum shows up as O(1).
constexpr double kRelSlack = 0.10;
constexpr double kAbsSlack = 1e-5;
constexpr int kSampledColumns = 256;

// Counts elements where a != b (as bits), into *count.
__global__ void count_differences_kernel(const uint16_t* a, const uint16_t* b, int64_t n, unsigned long long* count) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    local += a[i] != b[i];
  if (local) atomicAdd(count, local);
}

void fill_uniform(void* p, int64_t count, std::mt19937_64& rng, cudaStream_t stream = nullptr, float scale = 1.0f) {
  fill_uniform_bf16(p, count, rng(), scale, stream);
}

uint64_t count_differences(const void* a, const void* b, int64_t n) {
  DeviceBuffer count(sizeof(unsigned long long));
  TPD_CUDA(cudaMemset(count.get(), 0, sizeof(unsigned long long)));
  count_differences_kernel<<<256, 256>>>(static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), n,
                                         count.as<unsigned long long>());
  TPD_CUDA(cudaGetLastError());
  return test::to_host<unsigned long long>(count, 1)[0];
}

// A tuner of the test's own: no file, and tuning only where a test asks for it.
std::shared_ptr<GemmTuner> private_tuner(bool enabled) {
  GemmTunerOptions o;
  o.enabled = enabled;
  return std::make_shared<GemmTuner>(o);
}

int sm_count() {
  int sms = 0;
  TPD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  return sms;
}

// One weight with fresh data, the FP64 reference on a sample of its rows.
struct Problem {
  int64_t n, k;
  DeviceBuffer w;                    // [N, K] bf16
  DeviceBuffer x;                    // [32, K] bf16: a call of M rows uses the first M
  std::vector<int64_t> columns;      // sampled output columns
  std::vector<double> ref;           // [32, columns] FP64
  std::vector<uint16_t> x_host;

  Problem(int64_t n_, int64_t k_, std::mt19937_64& rng)
      : n(n_), k(k_), w(static_cast<std::size_t>(n_ * k_) * 2), x(static_cast<std::size_t>(kWarpMaxRows * k_) * 2) {
    fill_uniform(w.get(), n * k, rng);
    fill_uniform(x.get(), kWarpMaxRows * k, rng);
    TPD_CUDA(cudaDeviceSynchronize());
    x_host = test::to_host<uint16_t>(x, static_cast<std::size_t>(kWarpMaxRows * k));
    columns = {0, n - 1};
    std::uniform_int_distribution<int64_t> pick(0, n - 1);
    while (static_cast<int64_t>(columns.size()) < std::min<int64_t>(n, kSampledColumns)) columns.push_back(pick(rng));
    std::vector<uint16_t> w_rows(columns.size() * static_cast<std::size_t>(k));
    for (std::size_t c = 0; c < columns.size(); ++c)
      TPD_CUDA(cudaMemcpy(w_rows.data() + c * k, w.as<uint16_t>() + columns[c] * k, static_cast<std::size_t>(k) * 2,
                          cudaMemcpyDeviceToHost));
    ref = reference::gemm_bf16(x_host, w_rows, kWarpMaxRows, static_cast<int64_t>(columns.size()), k);
  }
  TensorView weight() const { return TensorView::bf16(w.get(), n, k); }
  TensorView rows(int m) const { return TensorView::bf16(x.get(), m, k); }

  // Relative error of out[m, N] on the sampled columns.
  double error(const DeviceBuffer& out, int m) const {
    const std::vector<uint16_t> got = test::to_host<uint16_t>(out, static_cast<std::size_t>(m * n));
    std::vector<double> a, r;
    for (int row = 0; row < m; ++row)
      for (std::size_t c = 0; c < columns.size(); ++c) {
        a.push_back(bf16::to_float(got[row * n + columns[c]]));
        r.push_back(ref[row * columns.size() + c]);
      }
    return reference::relative_error(a, r);
  }
};

// Every check of one (shape, M, decision): path, error vs cuBLAS, all written,
// bitwise repeats.
void check_rows(const Problem& p, DecodeGemm& gemm, CublasContext& cublas, int m, int repeats) {
  const GemmDecision& d = gemm.decision(m);
  SCOPED_TRACE(testing::Message() << p.n << "x" << p.k << " M " << m << " " << describe(d));
  const std::size_t bytes = static_cast<std::size_t>(m * p.n) * 2;
  DeviceBuffer out(bytes), again(bytes), base(bytes);
  test::poison(out);
  test::poison(base);
  EXPECT_EQ(gemm.run(p.rows(m), TensorView::bf16(out.get(), m, p.n), nullptr), d.path);
  cublas.gemm(p.rows(m), p.weight(), TensorView::bf16(base.get(), m, p.n), nullptr);
  TPD_CUDA(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = test::to_host<uint16_t>(out, bytes / 2);
  ASSERT_EQ(std::count(got.begin(), got.end(), test::kPoison16), 0) << "output elements left unwritten";
  const double ours = p.error(out, m);
  const double theirs = p.error(base, m);
  EXPECT_LE(ours, theirs * (1 + kRelSlack) + kAbsSlack) << "cuBLAS " << theirs;
  EXPECT_LT(ours, 1e-2);
  for (int r = 0; r < repeats; ++r) {
    test::poison(again);
    gemm.run(p.rows(m), TensorView::bf16(again.get(), m, p.n), nullptr);
    ASSERT_EQ(count_differences(out.get(), again.get(), m * p.n), 0u) << "run " << r + 2 << " differs";
  }
}

std::vector<int> row_counts() {
  if (quick()) return {1, 8, 9, 17, 32};
  std::vector<int> ms(kWarpMaxRows);
  for (int m = 1; m <= kWarpMaxRows; ++m) ms[m - 1] = m;
  return ms;
}

// The engine decisions checked for (shape, m): a stream-K variant (a different one
// from M to M, so every variant meets every token tile) and the warp engine at the
// rule's split where it takes the shape.
std::vector<GemmDecision> engine_decisions(int64_t n, int64_t k, int m) {
  std::vector<GemmDecision> out;
  std::vector<int> fits;
  for (int v = 0; v < static_cast<int>(kStreamVariants.size()); ++v)
    if (stream_variant_fits(m, v)) fits.push_back(v);
  out.push_back(stream_decision(fits[static_cast<std::size_t>(m + n / 16) % fits.size()]));
  if (warp_eligible(n, k)) out.push_back(warp_decision(choose_tactic(n, k, m, sm_count()).split));
  return out;
}

void check_shape(int64_t n, int64_t k, std::mt19937_64& rng, CublasContext& cublas, int repeats) {
  Problem p(n, k, rng);
  DecodeGemm gemm(p.weight(), nullptr, private_tuner(false));
  for (int m : row_counts())
    for (const GemmDecision& d : engine_decisions(n, k, m)) {
      gemm.force(m, d);
      check_rows(p, gemm, cublas, m, m == 1 || m == 8 || m == 32 ? repeats : 1);
    }
}

struct Shape {
  int64_t n, k;
};

std::vector<Shape> reference_shapes() {
  std::vector<Shape> tp8 = {{2112, 7168}, {2304, 1536}, {7168, 1536}, {4608, 7168},
                            {7168, 2304}, {20480, 7168}, {896, 35840}};
  if (quick()) return tp8;
  const std::vector<Shape> tp1 = {{18432, 1536}, {7168, 12288}, {36864, 7168}, {7168, 18432}, {163840, 7168},
                                  {7168, 35840}};
  tp8.insert(tp8.end(), tp1.begin(), tp1.end());
  return tp8;
}

TEST(DecodeGemm, ReferenceShapesEveryRowCount) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  CublasContext cublas;
  for (const Shape& s : reference_shapes()) check_shape(s.n, s.k, rng, cublas, quick() ? 2 : 10);
}

TEST(DecodeGemm, RandomEligibleShapes) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  CublasContext cublas;
  const int want = quick() ? 6 : 50;
  const int64_t max_n = quick() ? 4096 : 32768;
  const int64_t max_k = quick() ? 4096 : 24576;  // beyond the warp engine's 64 K tiles: stream-K alone
  for (int done = 0; done < want; ++done) {
    const int64_t n = 16 * static_cast<int64_t>(1 + rng() % (max_n / 16));
    const int64_t k = 128 * static_cast<int64_t>(1 + rng() % (max_k / 128));
    check_shape(n, k, rng, cublas, 2);
  }
}

// Shapes where split tiles have many contributors, a tile is partly past N, or one
// CTA does everything.
TEST(DecodeGemm, StreamKEdgeShapesEveryVariant) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  CublasContext cublas;
  for (const Shape& s : std::vector<Shape>{{64, 8192}, {16, 128}, {80, 1024}, {4096, 128}, {48, 40960}, {2112, 7168}}) {
    Problem p(s.n, s.k, rng);
    DecodeGemm gemm(p.weight(), nullptr, private_tuner(false));
    for (int v = 0; v < static_cast<int>(kStreamVariants.size()); ++v)
      for (int m : {1, 8, 13, 32}) {
        if (!stream_variant_fits(m, v)) continue;
        gemm.force(m, stream_decision(v));
        check_rows(p, gemm, cublas, m, 3);
      }
  }
}

TEST(DecodeGemm, EveryWarpSplitAgrees) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  Problem p(2112, 7168, rng);
  CublasContext cublas;
  DecodeGemm gemm(p.weight(), nullptr, private_tuner(false));
  for (int split : {1, 2, 4, 8})
    for (int m : {1, 13, 32}) {
      gemm.force(m, warp_decision(split));
      ASSERT_EQ(gemm.decision(m).split, split);
      check_rows(p, gemm, cublas, m, 2);
    }
}

TEST(DecodeGemm, GraphCaptureAndReplay) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  Problem p(4608, 7168, rng);
  DecodeGemm gemm(p.weight(), nullptr, private_tuner(false));
  cudaStream_t stream;
  TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int m = 8;
  gemm.force(m, stream_decision(0));
  DeviceBuffer eager(static_cast<std::size_t>(m * p.n) * 2), replayed(eager.bytes()), late(eager.bytes());
  ASSERT_EQ(gemm.run(p.rows(m), TensorView::bf16(eager.get(), m, p.n), stream), GemmPath::kStreamK);
  ASSERT_FALSE(gemm.prepared(13));

  cudaGraph_t graph;
  TPD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const GemmPath captured = gemm.run(p.rows(m), TensorView::bf16(replayed.get(), m, p.n), stream);
  // A bucket first seen under capture is not decided there: it runs the static rule
  // (cuBLAS for this shape at 13 rows).
  const GemmPath first_seen = gemm.run(p.rows(13), TensorView::bf16(late.get(), 13, p.n), stream);
  EXPECT_THROW(gemm.prepare(20, stream), InvalidArgument);
  TPD_CUDA(cudaStreamEndCapture(stream, &graph));
  EXPECT_EQ(captured, GemmPath::kStreamK);
  EXPECT_EQ(first_seen, GemmPath::kCublas);
  EXPECT_FALSE(gemm.prepared(13));

  cudaGraphExec_t exec;
  TPD_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    test::poison(replayed, stream);
    TPD_CUDA(cudaGraphLaunch(exec, stream));
    TPD_CUDA(cudaStreamSynchronize(stream));
    EXPECT_EQ(count_differences(eager.get(), replayed.get(), m * p.n), 0u) << "replay " << replay;
  }
  // Fresh inputs in the captured buffer: the replay computes the new product.
  fill_uniform(p.x.get(), kWarpMaxRows * p.k, rng, stream);
  TPD_CUDA(cudaGraphLaunch(exec, stream));
  DeviceBuffer direct(eager.bytes());
  gemm.run(p.rows(m), TensorView::bf16(direct.get(), m, p.n), stream);
  TPD_CUDA(cudaStreamSynchronize(stream));
  EXPECT_EQ(count_differences(direct.get(), replayed.get(), m * p.n), 0u);
  EXPECT_NE(count_differences(direct.get(), eager.get(), m * p.n), 0u);
  TPD_CUDA(cudaGraphExecDestroy(exec));
  TPD_CUDA(cudaGraphDestroy(graph));
  TPD_CUDA(cudaStreamDestroy(stream));
}

// A chain where each GEMM reads the previous one's output and overwrites the buffer
// the one before read (ping-pong), engines alternating: with PDL (each kernel
// launched early, its weights requested before griddepcontrol.wait) the result must
// be bitwise the one without, eagerly and in every replay of a graph.
TEST(DecodeGemm, PdlChainsBackToBack) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  constexpr int64_t kDim = 4096;
  const std::vector<GemmDecision> links = {stream_decision(0), warp_decision(2),   stream_decision(2),
                                           stream_decision(3), warp_decision(1),   cublas_decision(),
                                           stream_decision(0), stream_decision(2)};
  const int m = 7;
  std::vector<DeviceBuffer> weights;
  std::vector<std::unique_ptr<DecodeGemm>> gemms;
  auto context = std::make_shared<CublasContext>();  // one stream: one context, shared workspace
  for (const GemmDecision& d : links) {
    weights.emplace_back(static_cast<std::size_t>(kDim * kDim) * 2);
    fill_uniform(weights.back().get(), kDim * kDim, rng, nullptr, 1.0f / 64);  // keeps values O(1) along the chain
    gemms.push_back(std::make_unique<DecodeGemm>(TensorView::bf16(weights.back().get(), kDim, kDim), context,
                                                 private_tuner(false)));
    gemms.back()->force(m, d);
  }
  const std::size_t bytes = static_cast<std::size_t>(m * kDim) * 2;
  DeviceBuffer input(bytes), ping(bytes), pong(bytes), with_pdl(bytes), without(bytes);
  fill_uniform(input.get(), m * kDim, rng);
  cudaStream_t stream;
  TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto chain = [&](bool pdl, cudaStream_t s) {
    TPD_CUDA(cudaMemcpyAsync(ping.get(), input.get(), bytes, cudaMemcpyDeviceToDevice, s));
    for (std::size_t i = 0; i < gemms.size(); ++i) {
      gemms[i]->set_pdl(pdl);
      const DeviceBuffer& from = i % 2 ? pong : ping;
      const DeviceBuffer& to = i % 2 ? ping : pong;
      gemms[i]->run(TensorView::bf16(from.get(), m, kDim), TensorView::bf16(to.get(), m, kDim), s);
    }
  };
  const DeviceBuffer& result = gemms.size() % 2 ? pong : ping;
  chain(false, stream);
  TPD_CUDA(cudaMemcpyAsync(without.get(), result.get(), bytes, cudaMemcpyDeviceToDevice, stream));
  chain(true, stream);
  TPD_CUDA(cudaMemcpyAsync(with_pdl.get(), result.get(), bytes, cudaMemcpyDeviceToDevice, stream));
  TPD_CUDA(cudaStreamSynchronize(stream));
  EXPECT_EQ(count_differences(with_pdl.get(), without.get(), m * kDim), 0u) << "eager chain";
  const std::vector<uint16_t> host = test::to_host<uint16_t>(without, bytes / 2);
  EXPECT_GT(std::count_if(host.begin(), host.end(), [](uint16_t v) { return (v & 0x7fff) != 0; }), m * kDim / 2);

  cudaGraph_t graph;
  TPD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 3; ++i) chain(true, stream);  // chains back to back in one graph
  TPD_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  TPD_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < (quick() ? 3 : 20); ++replay) {
    test::poison(ping, stream);
    test::poison(pong, stream);
    TPD_CUDA(cudaGraphLaunch(exec, stream));
    TPD_CUDA(cudaStreamSynchronize(stream));
    ASSERT_EQ(count_differences(result.get(), without.get(), m * kDim), 0u) << "replay " << replay;
  }
  TPD_CUDA(cudaGraphExecDestroy(exec));
  TPD_CUDA(cudaGraphDestroy(graph));
  TPD_CUDA(cudaStreamDestroy(stream));
}

// The measured dispatch on the GPU: the first eager call times the candidates and
// keeps one of them; the next DecodeGemm of the shape reuses the decision.
TEST(DecodeGemm, TuningPicksACandidateAndReusesIt) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  auto tuner = private_tuner(true);
  Problem p(4608, 7168, rng);
  DecodeGemm gemm(p.weight(), nullptr, tuner);
  const int m = 4;
  DeviceBuffer out(static_cast<std::size_t>(m * p.n) * 2);
  const GemmPath taken = gemm.run(p.rows(m), TensorView::bf16(out.get(), m, p.n), nullptr);
  TPD_CUDA(cudaDeviceSynchronize());
  ASSERT_TRUE(gemm.prepared(m));
  const GemmDecision d = gemm.decision(m);
  EXPECT_EQ(d.source, GemmSource::kTuned);
  EXPECT_EQ(taken, d.path);
  EXPECT_GT(d.measured_us, 0.0f);
  EXPECT_LT(p.error(out, m), 1e-2);
  const std::vector<GemmDecision> candidates = gemm.candidates(gemm_bucket_max(gemm_m_bucket(m)));
  EXPECT_TRUE(std::any_of(candidates.begin(), candidates.end(), [&](const GemmDecision& c) { return c.same_path(d); }));
  std::cout << "[ tuned    ] 4608x7168 M " << m << ": " << describe(d) << ", " << d.measured_us << " us, tuning took "
            << d.tune_ms << " ms over " << candidates.size() << " candidates\n";

  Problem q(4608, 7168, rng);
  DecodeGemm other(q.weight(), nullptr, tuner);
  other.prepare(3);  // same bucket (3-4)
  EXPECT_TRUE(other.decision(3).same_path(d));
  EXPECT_EQ(other.decision(3).tune_ms, d.tune_ms);  // not re-timed
  CublasContext cublas;
  check_rows(q, other, cublas, 3, 2);
}

// Ranks with their own tuners (as separate processes would be) agree through the
// hook; on replicated weights their outputs are then bitwise identical.
TEST(DecodeGemm, RanksAgreeAndReplicatedGemmsMatchBitwise) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  constexpr int kRanks = 2;
  const int64_t n = 2112, k = 7168;
  const int m = 8;
  DeviceBuffer w(static_cast<std::size_t>(n * k) * 2), x(static_cast<std::size_t>(m * k) * 2);
  fill_uniform(w.get(), n * k, rng);
  fill_uniform(x.get(), m * k, rng);
  struct Broadcast {
    std::mutex mutex;
    std::condition_variable cv;
    std::optional<GemmDecision> root;
  } broadcast;
  std::vector<DeviceBuffer> outs;
  for (int r = 0; r < kRanks; ++r) outs.emplace_back(static_cast<std::size_t>(m * n) * 2);
  std::vector<GemmDecision> decided(kRanks);
  std::vector<GemmPath> undecided(kRanks);
  std::vector<std::string> failed(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      const std::size_t i = static_cast<std::size_t>(r);
      try {
        TPD_CUDA(cudaSetDevice(0));
        DeviceBuffer copy(static_cast<std::size_t>(n * k) * 2);  // this rank's replica of the weight
        TPD_CUDA(cudaMemcpy(copy.get(), w.get(), copy.bytes(), cudaMemcpyDeviceToDevice));
        DecodeGemm gemm(TensorView::bf16(copy.get(), n, k), nullptr, private_tuner(true));
        gemm.set_agreement([&, r](const GemmKey&, const GemmDecision& mine) {
          std::unique_lock lock(broadcast.mutex);
          if (r == 0) {
            broadcast.root = mine;
            broadcast.cv.notify_all();
          }
          broadcast.cv.wait(lock, [&] { return broadcast.root.has_value(); });
          return *broadcast.root;
        });
        cudaStream_t stream;
        TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        gemm.run(TensorView::bf16(x.get(), m, k), TensorView::bf16(outs[i].get(), m, n), stream);
        TPD_CUDA(cudaStreamSynchronize(stream));
        TPD_CUDA(cudaStreamDestroy(stream));
        decided[i] = gemm.decision(m);
        // With an agreement set, an undecided bucket (as under capture) runs the static rule.
        undecided[i] = gemm.path(20);
      } catch (const std::exception& e) {
        failed[i] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) ASSERT_EQ(failed[static_cast<std::size_t>(r)], "") << "rank " << r;
  for (int r = 1; r < kRanks; ++r) {
    EXPECT_TRUE(decided[static_cast<std::size_t>(r)].same_path(decided[0]))
        << describe(decided[0]) << " vs " << describe(decided[static_cast<std::size_t>(r)]);
    EXPECT_EQ(count_differences(outs[0].get(), outs[static_cast<std::size_t>(r)].get(), m * n), 0u);
  }
  const int sms = sm_count();
  for (GemmPath p : undecided) EXPECT_EQ(p, rule_decision(n, k, 20, sms, {true, true}).path);
}

// What the engines do not take runs on cuBLAS, and is right.
void expect_fallback(const TensorView& w, const TensorView& x, const std::vector<uint16_t>& w_host,
                     const std::vector<uint16_t>& x_host, const char* what) {
  SCOPED_TRACE(what);
  DecodeGemm gemm(w, nullptr, private_tuner(true));
  DeviceBuffer out(static_cast<std::size_t>(x.rows * w.rows) * 2);
  test::poison(out);
  const TensorView o = TensorView::bf16(out.get(), x.rows, w.rows);
  EXPECT_EQ(gemm.path(x, o), GemmPath::kCublas);
  EXPECT_EQ(gemm.run(x, o, nullptr), GemmPath::kCublas);
  TPD_CUDA(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = test::to_host<uint16_t>(out, static_cast<std::size_t>(x.rows * w.rows));
  std::vector<double> a(got.size());
  for (std::size_t i = 0; i < got.size(); ++i) a[i] = bf16::to_float(got[i]);
  EXPECT_LT(reference::relative_error(a, reference::gemm_bf16(x_host, w_host, x.rows, w.rows, w.cols)), 1e-2);
}

TEST(DecodeGemm, IneligibleCasesRunOnCublas) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  auto dense = [&](int64_t rows, int64_t cols, int64_t stride, int64_t offset) {
    std::vector<uint16_t> host = test::random_bf16(static_cast<std::size_t>(rows * cols), rng);
    std::vector<uint16_t> padded(static_cast<std::size_t>(offset + rows * stride), 0);
    for (int64_t r = 0; r < rows; ++r) std::copy_n(host.begin() + r * cols, cols, padded.begin() + offset + r * stride);
    return std::make_pair(std::move(host), test::to_device(padded));
  };
  {
    auto [wh, w] = dense(2120, 512, 512, 0);  // N % 16 != 0
    auto [xh, x] = dense(4, 512, 512, 0);
    expect_fallback(TensorView::bf16(w.get(), 2120, 512), TensorView::bf16(x.get(), 4, 512), wh, xh, "N % 16");
  }
  {
    auto [wh, w] = dense(256, 1000, 1000, 0);  // K % 128 != 0
    auto [xh, x] = dense(4, 1000, 1000, 0);
    expect_fallback(TensorView::bf16(w.get(), 256, 1000), TensorView::bf16(x.get(), 4, 1000), wh, xh, "K % 128");
  }
  auto [wh, w] = dense(512, 1024, 1024, 0);
  const TensorView wv = TensorView::bf16(w.get(), 512, 1024);
  {
    auto [xh, x] = dense(33, 1024, 1024, 0);
    expect_fallback(wv, TensorView::bf16(x.get(), 33, 1024), wh, xh, "M = 33");
  }
  {
    auto [xh, x] = dense(4, 1024, 1024, 1);  // 2-byte aligned
    expect_fallback(wv, TensorView::bf16(x.as<uint16_t>() + 1, 4, 1024), wh, xh, "misaligned x");
  }
  {
    auto [xh, x] = dense(4, 1024, 1032, 0);
    TensorView xv = TensorView::bf16(x.get(), 4, 1024);
    xv.row_stride = 1032;
    expect_fallback(wv, xv, wh, xh, "strided x");
  }
}

TEST(DecodeGemm, BadInputIsRefused) {
  TPD_REQUIRE_GPU();
  DeviceBuffer w(512 * 1024 * 2), x(4 * 1024 * 2), out(4 * 512 * 2);
  DecodeGemm gemm(TensorView::bf16(w.get(), 512, 1024), nullptr, private_tuner(false));
  const TensorView xv = TensorView::bf16(x.get(), 4, 1024);
  const TensorView ov = TensorView::bf16(out.get(), 4, 512);
  EXPECT_THROW(gemm.run(TensorView::bf16(nullptr, 4, 1024), ov, nullptr), InvalidArgument);
  EXPECT_THROW(gemm.run(TensorView::f32(x.get(), 4, 1024), ov, nullptr), InvalidArgument);
  EXPECT_THROW(gemm.run(TensorView::bf16(x.get(), 4, 1000), ov, nullptr), InvalidArgument);
  EXPECT_THROW(gemm.run(xv, TensorView::bf16(out.get(), 3, 512), nullptr), InvalidArgument);
  EXPECT_THROW(gemm.run(xv, TensorView::bf16(out.get(), 4, 500), nullptr), InvalidArgument);
  EXPECT_THROW(DecodeGemm(TensorView::bf16(nullptr, 16, 128)), InvalidArgument);
  EXPECT_EQ(gemm.path(4), GemmPath::kCublas);  // the static rule for K = 1024
  EXPECT_THROW(gemm.decision(4), InvalidArgument);
  gemm.force(4, stream_decision(0));
  EXPECT_EQ(gemm.path(4), GemmPath::kStreamK);
  EXPECT_EQ(gemm.path(3), GemmPath::kStreamK);  // same bucket
  EXPECT_EQ(gemm.path(33), GemmPath::kCublas);
  EXPECT_THROW(gemm.force(16, stream_decision(1)), InvalidArgument);  // 1 KB stages hold 8 rows at most
  EXPECT_THROW(gemm.force(4, stream_decision(17)), InvalidArgument);
  EXPECT_THROW(gemm.force(4, warp_decision(3)), InvalidArgument);
  EXPECT_THROW(gemm.force(33, stream_decision(0)), InvalidArgument);
}

// With tuning off, the dispatch is the static rule: the warp engine where it was
// measured ahead of cuBLAS, else cuBLAS.
TEST(DecodeGemm, StaticRuleWithoutTuning) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  Problem p(2112, 7168, rng);
  DecodeGemm gemm(p.weight(), nullptr, private_tuner(false));
  for (int m : {1, 8, 16, 32}) {
    DeviceBuffer out(static_cast<std::size_t>(m * p.n) * 2);
    const GemmPath taken = gemm.run(p.rows(m), TensorView::bf16(out.get(), m, p.n), nullptr);
    ASSERT_TRUE(gemm.prepared(m));
    EXPECT_EQ(gemm.decision(m).source, GemmSource::kRule);
    EXPECT_EQ(taken, choose_tactic(p.n, p.k, m, sm_count()).engine_preferred ? GemmPath::kWarpSplitK
                                                                              : GemmPath::kCublas)
        << m;
    EXPECT_EQ(taken, gemm.path(m)) << m;
    TPD_CUDA(cudaDeviceSynchronize());
    EXPECT_LT(p.error(out, m), 1e-2) << m;
  }
}

}  // namespace
}  // namespace tpdecode
