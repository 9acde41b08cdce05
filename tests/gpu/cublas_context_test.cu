// One CublasContext shared by calls on several streams at once: each stream has a
// workspace of its own, so every result is bitwise the one the same call gives
// alone, eagerly and from a graph whose stream's first call came under capture.
#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/gemm_problem.hpp"
#include "tpdecode/cublas_context.hpp"
#include "tpdecode/decode_gemm.hpp"

namespace tpdecode {
namespace {

using namespace test;  // fill_uniform, count_differences, poison (gemm_problem.hpp, gpu_test_util.hpp)

constexpr int64_t kN = 1536, kK = 7168;  // short and long: cuBLAS splits K, through the workspace
constexpr int kM = 8;
constexpr int kCalls = 24;  // per stream and path, queued at once

// A cuBLASLt algorithm with a split of K where the heuristic offers one (it keeps its
// partial sums in the workspace), else its first.
CublasLtAlgo split_algorithm(CublasContext& ctx, const TensorView& x, const TensorView& w, const TensorView& out) {
  const std::vector<CublasLtAlgo> algos = ctx.lt_algorithms(x, w, out, 16);
  if (algos.empty()) throw std::runtime_error("cuBLASLt offers no algorithm");
  for (const CublasLtAlgo& a : algos) {
    const std::string d = CublasContext::describe_lt(a);  // "... split-K <n>"
    if (std::stoi(d.substr(d.rfind(' ') + 1)) > 1) return a;
  }
  return algos.front();
}

struct Operands {
  DeviceBuffer w, x, alone_gemm, alone_lt;
  std::vector<DeviceBuffer> outs;  // [2 * kCalls]: cublasGemmEx's, then cuBLASLt's
  CublasLtAlgo algo{};

  Operands(CublasContext& ctx, std::mt19937_64& rng)
      : w(static_cast<std::size_t>(kN * kK) * 2),
        x(static_cast<std::size_t>(kM * kK) * 2),
        alone_gemm(out_bytes()),
        alone_lt(out_bytes()) {
    fill_uniform(w.get(), kN * kK, rng);
    fill_uniform(x.get(), kM * kK, rng);
    TPD_CUDA(cudaDeviceSynchronize());
    for (int i = 0; i < 2 * kCalls; ++i) outs.emplace_back(out_bytes());
    algo = split_algorithm(ctx, rows(), weight(), out(alone_lt));
  }
  static std::size_t out_bytes() { return static_cast<std::size_t>(kM * kN) * 2; }
  TensorView weight() const { return TensorView::bf16(w.get(), kN, kK); }
  TensorView rows() const { return TensorView::bf16(x.get(), kM, kK); }
  static TensorView out(const DeviceBuffer& b) { return TensorView::bf16(b.get(), kM, kN); }

  void queue_all(CublasContext& ctx, cudaStream_t stream) {
    for (int i = 0; i < kCalls; ++i) {
      ctx.gemm(rows(), weight(), out(outs[static_cast<std::size_t>(i)]), stream);
      ctx.gemm_lt(rows(), weight(), out(outs[static_cast<std::size_t>(kCalls + i)]), algo, stream);
    }
  }
  void expect_as_alone() const {
    for (int i = 0; i < 2 * kCalls; ++i)
      EXPECT_EQ(count_differences(outs[static_cast<std::size_t>(i)].get(), (i < kCalls ? alone_gemm : alone_lt).get(),
                                  kM * kN),
                0u)
          << (i < kCalls ? "cublasGemmEx" : "cuBLASLt") << " call " << i % kCalls;
  }
};

TEST(CublasContext, StreamsShareAContextAtOnce) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  CublasContext ctx;
  EXPECT_EQ(ctx.workspace_count(), 0u);  // none before a call
  Operands a(ctx, rng), b(ctx, rng);
  SCOPED_TRACE(CublasContext::describe_lt(a.algo) + " / " + CublasContext::describe_lt(b.algo));
  cudaStream_t alone, sa, sb;
  TPD_CUDA(cudaStreamCreateWithFlags(&alone, cudaStreamNonBlocking));
  TPD_CUDA(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
  TPD_CUDA(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
  for (Operands* o : {&a, &b}) {
    ctx.gemm(o->rows(), o->weight(), Operands::out(o->alone_gemm), alone);
    ctx.gemm_lt(o->rows(), o->weight(), Operands::out(o->alone_lt), o->algo, alone);
  }
  TPD_CUDA(cudaStreamSynchronize(alone));
  EXPECT_EQ(ctx.workspace_count(), 1u);

  for (int round = 0; round < 3; ++round) {
    for (Operands* o : {&a, &b})
      for (DeviceBuffer& out : o->outs) poison(out, alone);
    TPD_CUDA(cudaStreamSynchronize(alone));
    a.queue_all(ctx, sa);
    b.queue_all(ctx, sb);
    TPD_CUDA(cudaStreamSynchronize(sa));
    TPD_CUDA(cudaStreamSynchronize(sb));
    a.expect_as_alone();
    b.expect_as_alone();
  }
  EXPECT_EQ(ctx.workspace_count(), 3u);

  // A stream whose first call comes under a global-mode capture: its workspace is
  // made there, and the graph's replays run beside eager calls on another stream.
  cudaStream_t sc;
  TPD_CUDA(cudaStreamCreateWithFlags(&sc, cudaStreamNonBlocking));
  cudaGraph_t graph;
  TPD_CUDA(cudaStreamBeginCapture(sc, cudaStreamCaptureModeGlobal));
  a.queue_all(ctx, sc);
  TPD_CUDA(cudaStreamEndCapture(sc, &graph));
  EXPECT_EQ(ctx.workspace_count(), 4u);
  cudaGraphExec_t exec;
  TPD_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    for (Operands* o : {&a, &b})
      for (DeviceBuffer& out : o->outs) poison(out, alone);
    TPD_CUDA(cudaStreamSynchronize(alone));
    TPD_CUDA(cudaGraphLaunch(exec, sc));
    b.queue_all(ctx, sb);
    TPD_CUDA(cudaStreamSynchronize(sc));
    TPD_CUDA(cudaStreamSynchronize(sb));
    a.expect_as_alone();
    b.expect_as_alone();
  }
  TPD_CUDA(cudaGraphExecDestroy(exec));
  TPD_CUDA(cudaGraphDestroy(graph));
  for (cudaStream_t s : {alone, sa, sb, sc}) TPD_CUDA(cudaStreamDestroy(s));
}

// The tuner times on a stream it keeps per thread and device, so tuning bucket after
// bucket adds no workspace (a stream per timing once added one per timing).
TEST(CublasContext, TuningAddsNoWorkspacePerTiming) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  DeviceBuffer w(static_cast<std::size_t>(kN * kK) * 2);
  fill_uniform(w.get(), kN * kK, rng);
  auto ctx = std::make_shared<CublasContext>();
  DecodeGemm gemm(TensorView::bf16(w.get(), kN, kK), ctx, private_tuner(true));
  cudaStream_t stream;
  TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  gemm.prepare(1, stream);
  const std::size_t after_one = ctx->workspace_count();
  EXPECT_GE(after_one, 1u);  // cuBLAS is among every tuning's candidates
  for (int m : {8, 16, 40, 64}) gemm.prepare(m, stream);
  EXPECT_EQ(ctx->workspace_count(), after_one);
  TPD_CUDA(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace tpdecode
