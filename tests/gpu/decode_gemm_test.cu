// DecodeGemm on the GPU: the warp split-K engine against an FP64 reference (no
// worse than cuBLAS on the same inputs, plus a stated slack), bitwise repeatable,
// every output element written, graph capture and replay, the cuBLAS fallback
// for what the engine does not take, and bad input refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <vector>

#include "gpu/gpu_test_util.hpp"
#include "tpdecode/bf16.hpp"
#include "tpdecode/decode_gemm.hpp"
#include "tpdecode/random_fill.hpp"
#include "reference/gemm.hpp"

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

void fill_uniform(void* p, int64_t count, std::mt19937_64& rng, cudaStream_t stream = nullptr) {
  fill_uniform_bf16(p, count, rng(), 1.0f, stream);
}

uint64_t count_differences(const void* a, const void* b, int64_t n) {
  DeviceBuffer count(sizeof(unsigned long long));
  TPD_CUDA(cudaMemset(count.get(), 0, sizeof(unsigned long long)));
  count_differences_kernel<<<256, 256>>>(static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), n,
                                         count.as<unsigned long long>());
  TPD_CUDA(cudaGetLastError());
  return test::to_host<unsigned long long>(count, 1)[0];
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

// Every check of one (shape, M): path, error vs cuBLAS, all written, bitwise repeats.
void check_rows(const Problem& p, DecodeGemm& gemm, CublasContext& cublas, int m, int repeats) {
  SCOPED_TRACE(testing::Message() << p.n << "x" << p.k << " M " << m);
  const std::size_t bytes = static_cast<std::size_t>(m * p.n) * 2;
  DeviceBuffer out(bytes), again(bytes), base(bytes);
  test::poison(out);
  test::poison(base);
  const bool engine = warp_eligible(p.n, p.k);
  EXPECT_EQ(gemm.run(p.rows(m), TensorView::bf16(out.get(), m, p.n), nullptr),
            engine ? GemmPath::kWarpSplitK : GemmPath::kCublas);
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

void check_shape(int64_t n, int64_t k, std::mt19937_64& rng, CublasContext& cublas, int repeats) {
  Problem p(n, k, rng);
  DecodeGemm gemm(p.weight());
  gemm.set_dispatch(GemmDispatch::kEngine);
  for (int m : row_counts()) check_rows(p, gemm, cublas, m, m == 1 || m == 8 || m == 32 ? repeats : 1);
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
  const int64_t max_k = quick() ? 4096 : 16384;
  for (int done = 0; done < want;) {
    const int64_t n = 16 * static_cast<int64_t>(1 + rng() % (max_n / 16));
    const int64_t k = 128 * static_cast<int64_t>(1 + rng() % (max_k / 128));
    if (!warp_eligible(n, k)) continue;
    check_shape(n, k, rng, cublas, 2);
    ++done;
  }
}

TEST(DecodeGemm, EveryForcedSplitAgrees) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  Problem p(2112, 7168, rng);
  CublasContext cublas;
  DecodeGemm gemm(p.weight());
  gemm.set_dispatch(GemmDispatch::kEngine);
  for (int split : {1, 2, 4, 8})
    for (int m : {1, 13, 32}) {
      gemm.set_split(m, split);
      ASSERT_EQ(gemm.tactic(m).split, split);
      check_rows(p, gemm, cublas, m, 2);
    }
}

TEST(DecodeGemm, GraphCaptureAndReplay) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  Problem p(4608, 7168, rng);
  DecodeGemm gemm(p.weight());
  gemm.set_dispatch(GemmDispatch::kEngine);
  cudaStream_t stream;
  TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int m = 8;
  DeviceBuffer eager(static_cast<std::size_t>(m * p.n) * 2), replayed(eager.bytes()), late(eager.bytes());
  ASSERT_EQ(gemm.run(p.rows(m), TensorView::bf16(eager.get(), m, p.n), stream), GemmPath::kWarpSplitK);
  ASSERT_FALSE(gemm.prepared(5));

  cudaGraph_t graph;
  TPD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const GemmPath captured = gemm.run(p.rows(m), TensorView::bf16(replayed.get(), m, p.n), stream);
  // An M first seen under capture is not prepared there: it runs on cuBLAS.
  const GemmPath first_seen = gemm.run(p.rows(5), TensorView::bf16(late.get(), 5, p.n), stream);
  EXPECT_THROW(gemm.prepare(6, stream), InvalidArgument);
  TPD_CUDA(cudaStreamEndCapture(stream, &graph));
  EXPECT_EQ(captured, GemmPath::kWarpSplitK);
  EXPECT_EQ(first_seen, GemmPath::kCublas);
  EXPECT_FALSE(gemm.prepared(5));

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

// What the engine does not take runs on cuBLAS, and is right.
void expect_fallback(const TensorView& w, const TensorView& x, const std::vector<uint16_t>& w_host,
                     const std::vector<uint16_t>& x_host, const char* what) {
  SCOPED_TRACE(what);
  DecodeGemm gemm(w);
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
  DecodeGemm gemm(TensorView::bf16(w.get(), 512, 1024));
  const TensorView xv = TensorView::bf16(x.get(), 4, 1024);
  const TensorView ov = TensorView::bf16(out.get(), 4, 512);
  EXPECT_THROW(gemm.run(TensorView::bf16(nullptr, 4, 1024), ov, nullptr), InvalidArgument);
  EXPECT_THROW(gemm.run(TensorView::f32(x.get(), 4, 1024), ov, nullptr), InvalidArgument);
  EXPECT_THROW(gemm.run(TensorView::bf16(x.get(), 4, 1000), ov, nullptr), InvalidArgument);
  EXPECT_THROW(gemm.run(xv, TensorView::bf16(out.get(), 3, 512), nullptr), InvalidArgument);
  EXPECT_THROW(gemm.run(xv, TensorView::bf16(out.get(), 4, 500), nullptr), InvalidArgument);
  EXPECT_THROW(DecodeGemm(TensorView::bf16(nullptr, 16, 128)), InvalidArgument);
  gemm.set_dispatch(GemmDispatch::kEngine);
  EXPECT_EQ(gemm.path(4), GemmPath::kCublas);
  gemm.prepare(4);
  EXPECT_EQ(gemm.path(4), GemmPath::kWarpSplitK);
  EXPECT_EQ(gemm.path(33), GemmPath::kCublas);
}

// The default dispatch takes the engine only where the tactic rule prefers it.
TEST(DecodeGemm, RuleDispatchFollowsTheTactic) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  Problem p(2112, 7168, rng);
  DecodeGemm gemm(p.weight());
  for (int m : {1, 8, 16, 32}) {
    DeviceBuffer out(static_cast<std::size_t>(m * p.n) * 2);
    const GemmPath taken = gemm.run(p.rows(m), TensorView::bf16(out.get(), m, p.n), nullptr);
    ASSERT_TRUE(gemm.prepared(m));
    EXPECT_EQ(taken, gemm.tactic(m).engine_preferred ? GemmPath::kWarpSplitK : GemmPath::kCublas) << m;
    EXPECT_EQ(taken, gemm.path(m)) << m;
    TPD_CUDA(cudaDeviceSynchronize());
    EXPECT_LT(p.error(out, m), 1e-2) << m;
  }
}

}  // namespace
}  // namespace tpdecode
