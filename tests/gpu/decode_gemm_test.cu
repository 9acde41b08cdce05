// DecodeGemm's engines on the GPU: the wgmma engine's tactics and the warp split-K
// at its splits against an FP64 reference (no worse than cuBLAS on the same inputs, plus a stated
// slack), bitwise repeatable, every output element written; graph capture and
// replay; chains with true dependencies under programmatic dependent launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "gemm/gemm_tactic.hpp"
#include "gpu/gemm_problem.hpp"
#include "tpdecode/decode_gemm.hpp"

namespace tpdecode {
namespace {

using namespace test;  // the GEMM test helpers (gemm_problem.hpp)

std::vector<int> row_counts() {
  if (quick()) return {1, 8, 9, 17, 32, 33, 64};
  std::vector<int> ms(kGemmMaxRows);
  for (int m = 1; m <= kGemmMaxRows; ++m) ms[m - 1] = m;
  return ms;
}

// The engine decisions checked for (shape, m): the warp engine at the rule's split
// (its split for 32 rows above 32) and at another legal split, its narrow CTAs (up to
// 16 rows; the one-tile CTA in both forms) at other splits, and two of each wgmma form's tactics (different ones from M
// to M, so that every tactic meets every token tile).
std::vector<GemmDecision> engine_decisions(int64_t n, int64_t k, int m) {
  std::vector<GemmDecision> out;
  if (warp_eligible(n, k) && m <= kWarpMaxRows) {
    std::vector<int> legal;
    for (int split = 1; split <= kWarpMaxSplit; ++split)
      if (warp_split_ok(k, split)) legal.push_back(split);
    const int rule = choose_tactic(n, k, std::min(m, kWarpCandidateMaxRows), sm_count()).split;
    const int other = legal[static_cast<std::size_t>(m + n / 16) % legal.size()];
    out.push_back(warp_decision(rule));
    if (other != rule) out.push_back(warp_decision(other));
    if (warp_row_tiles_ok(1, m)) {
      out.push_back(warp_decision(legal[static_cast<std::size_t>(3 * m + n / 64) % legal.size()], 1));
      out.push_back(warp_decision(legal[static_cast<std::size_t>(5 * m + n / 32) % legal.size()], 2));
      if (warp_tensor_map_ok(n, k))
        out.push_back(warp_decision(legal[static_cast<std::size_t>(7 * m + n / 16) % legal.size()], 1, true));
    }
  }
  for (const std::vector<GemmDecision>& tactics : {wgmma_candidates(n, k, m), wgmma_wide_candidates(n, k, m)})
    if (!tactics.empty()) {
      const std::size_t a = static_cast<std::size_t>(m + n / 16) % tactics.size();
      const std::size_t b = static_cast<std::size_t>(7 * m + n / 64 + 3) % tactics.size();
      out.push_back(tactics[a]);
      if (b != a) out.push_back(tactics[b]);
    }
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
  const int64_t max_k = quick() ? 4096 : 24576;
  for (int done = 0; done < want; ++done) {
    const int64_t n = 16 * static_cast<int64_t>(1 + rng() % (max_n / 16));
    const int64_t k = 128 * static_cast<int64_t>(1 + rng() % (max_k / 128));
    check_shape(n, k, rng, cublas, 2);
  }
}

// The warp engine's CTA forms at one split: the wide CTA, the two narrow ones and the
// one-tile CTA's tensor-map form.
std::vector<GemmDecision> warp_forms(int split) {
  std::vector<GemmDecision> out;
  for (int row_tiles : kWarpRowTileChoices) out.push_back(warp_decision(split, row_tiles));
  out.push_back(warp_decision(split, 1, true));
  return out;
}

// Shapes where one 64-row block is partly past N, one CTA does everything, or a
// cluster's K ranges are uneven or long.
TEST(DecodeGemm, EdgeShapesEverySplit) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  CublasContext cublas;
  std::vector<Shape> shapes = {{64, 8192}, {16, 128}, {80, 1024}};
  if (!small()) shapes.insert(shapes.end(), {{4096, 128}, {48, 40960}, {2112, 1920}});
  for (const Shape& s : shapes) {
    Problem p(s.n, s.k, rng);
    DecodeGemm gemm(p.weight(), nullptr, private_tuner(false));
    for (int split = 1; split <= kWarpMaxSplit; ++split)
      for (int m : small() ? std::vector<int>{1, 13} : std::vector<int>{1, 8, 13, 32})
        for (const GemmDecision& form : warp_forms(split)) {
          if (!warp_split_ok(s.k, split) || !warp_row_tiles_ok(form.sub_tiles, m)) continue;
          if (small() && split != 1 && split != 3 && split != 8) continue;
          gemm.force(m, form);
          check_rows(p, gemm, cublas, m, small() ? 1 : 3);
        }
  }
}

TEST(DecodeGemm, EveryWarpSplitAgrees) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  Problem p(2112, 7168, rng);
  CublasContext cublas;
  DecodeGemm gemm(p.weight(), nullptr, private_tuner(false));
  for (int split = 1; split <= kWarpMaxSplit; ++split)
    for (int m : {1, 5, 13, 32})
      for (const GemmDecision& form : warp_forms(split)) {
        if (!warp_row_tiles_ok(form.sub_tiles, m)) continue;
        gemm.force(m, form);
        ASSERT_EQ(gemm.decision(m).split, split);
        ASSERT_EQ(gemm.decision(m).sub_tiles, form.sub_tiles);
        ASSERT_EQ(warp_tensor_map(gemm.decision(m)), warp_tensor_map(form));
        check_rows(p, gemm, cublas, m, 2);
      }
}

// A cuBLASLt decision runs cuBLASLt, correctly, at every row count of its bucket,
// call after call (the verdict of its algorithm's check is kept per row count), and
// again after the decisions are dropped and made anew.
TEST(DecodeGemm, CublasLtDecisionAtEveryRowCountOfItsBucket) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  Problem p(4096, 4096, rng);
  CublasContext cublas;
  DecodeGemm gemm(p.weight(), nullptr, private_tuner(false));
  for (int bucket : {0, gemm_m_bucket(8), gemm_m_bucket(40)}) {
    const int first = gemm_bucket_min(bucket), last = gemm_bucket_max(bucket);
    std::vector<GemmDecision> lt;
    for (const GemmDecision& d : gemm.candidates(last))
      if (d.path == GemmPath::kCublasLt) lt.push_back(d);
    if (lt.empty()) GTEST_SKIP() << "cuBLASLt offers no algorithm for 4096x4096 at " << last << " rows";
    for (int round = 0; round < 2; ++round) {
      gemm.force(last, lt[static_cast<std::size_t>(round) % lt.size()]);
      for (int m = first; m <= last; ++m) {
        ASSERT_EQ(gemm.path(m), GemmPath::kCublasLt) << m << " rows";
        check_rows(p, gemm, cublas, m, 0);
        check_rows(p, gemm, cublas, m, 0);
      }
      gemm.set_chain(!gemm.chain());  // drops every decision
      ASSERT_FALSE(gemm.prepared(last));
    }
  }
}

// One engine decision captured into a graph and replayed, with a bucket first seen
// under capture beside it.
void capture_and_replay(const GemmDecision& forced, int m, std::mt19937_64& rng) {
  SCOPED_TRACE(describe(forced));
  Problem p(4608, 7168, rng);
  DecodeGemm gemm(p.weight(), nullptr, private_tuner(false));
  cudaStream_t stream;
  TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  gemm.force(m, forced);
  const int late_m = m == 8 ? 13 : 20;  // another bucket
  DeviceBuffer eager(static_cast<std::size_t>(m * p.n) * 2), replayed(eager.bytes()),
      late(static_cast<std::size_t>(late_m * p.n) * 2);
  ASSERT_EQ(gemm.run(p.rows(m), TensorView::bf16(eager.get(), m, p.n), stream), forced.path);
  ASSERT_FALSE(gemm.prepared(late_m));

  cudaGraph_t graph;
  TPD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const GemmPath captured = gemm.run(p.rows(m), TensorView::bf16(replayed.get(), m, p.n), stream);
  // A bucket first seen under capture is not decided there: it runs the static rule.
  const GemmPath first_seen = gemm.run(p.rows(late_m), TensorView::bf16(late.get(), late_m, p.n), stream);
  EXPECT_THROW(gemm.prepare(late_m, stream), InvalidArgument);
  TPD_CUDA(cudaStreamEndCapture(stream, &graph));
  EXPECT_EQ(captured, forced.path);
  EXPECT_EQ(first_seen,
            rule_decision(p.n, p.k, gemm_bucket_max(gemm_m_bucket(late_m)), sm_count(), {true, true}).path);
  EXPECT_FALSE(gemm.prepared(late_m));

  cudaGraphExec_t exec;
  TPD_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    test::poison(replayed, stream);
    TPD_CUDA(cudaGraphLaunch(exec, stream));
    TPD_CUDA(cudaStreamSynchronize(stream));
    EXPECT_EQ(count_differences(eager.get(), replayed.get(), m * p.n), 0u) << "replay " << replay;
  }
  // Fresh inputs in the captured buffer: the replay computes the new product.
  fill_uniform(p.x.get(), kProblemRows * p.k, rng, stream);
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

TEST(DecodeGemm, GraphCaptureAndReplay) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  capture_and_replay(warp_decision(4), 8, rng);
  capture_and_replay(warp_decision(3, 1), 8, rng);
  capture_and_replay(warp_decision(3, 1, true), 8, rng);
  capture_and_replay(wgmma_decision(3, 1, 11), 8, rng);
  capture_and_replay(wgmma_decision(2, 1, 4), 40, rng);
}

// A chain where each GEMM reads the previous one's output and overwrites the buffer
// the one before read (ping-pong), engines alternating: with PDL (each kernel
// launched early, its weights requested before griddepcontrol.wait) the result must
// be bitwise the one without, eagerly and in every replay of a graph.
TEST(DecodeGemm, PdlChainsBackToBack) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  constexpr int64_t kDim = 4096;
  const std::vector<GemmDecision> links = {warp_decision(4),         wgmma_decision(2, 1, 11), warp_decision(8),
                                           wgmma_decision(4, 2, 6), warp_decision(1),         cublas_decision(),
                                           wgmma_decision(1, 4, 6), warp_decision(5),         warp_decision(2, 1),
                                           warp_decision(1, 1)};
  const int m = 7;
  std::vector<DeviceBuffer> weights;
  std::vector<std::unique_ptr<DecodeGemm>> gemms;
  auto context = std::make_shared<CublasContext>();  // shared by the chain's links
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
  // Why: the fills ran on the legacy stream, which a non-blocking stream does not wait
  // for (run alone, the chain once read the input before its fill: all zeros).
  TPD_CUDA(cudaDeviceSynchronize());
  cudaStream_t stream;
  TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto nonzero = [&](const DeviceBuffer& b) {
    const std::vector<uint16_t> host = test::to_host<uint16_t>(b, bytes / 2);
    return std::count_if(host.begin(), host.end(), [](uint16_t v) { return (v & 0x7fff) != 0; });
  };
  // check_links: wait after each link and check that it wrote a product (mostly
  // nonzero values), so a link that writes nothing or zeros is named.
  auto chain = [&](bool pdl, cudaStream_t s, bool check_links = false) {
    TPD_CUDA(cudaMemcpyAsync(ping.get(), input.get(), bytes, cudaMemcpyDeviceToDevice, s));
    for (std::size_t i = 0; i < gemms.size(); ++i) {
      gemms[i]->set_pdl(pdl);
      const DeviceBuffer& from = i % 2 ? pong : ping;
      const DeviceBuffer& to = i % 2 ? ping : pong;
      gemms[i]->run(TensorView::bf16(from.get(), m, kDim), TensorView::bf16(to.get(), m, kDim), s);
      if (check_links) {
        TPD_CUDA(cudaStreamSynchronize(s));
        ASSERT_GT(nonzero(to), m * kDim / 2) << "link " << i << " (" << describe(links[i]) << ")";
      }
    }
  };
  const DeviceBuffer& result = gemms.size() % 2 ? pong : ping;
  chain(false, stream, true);
  TPD_CUDA(cudaMemcpyAsync(without.get(), result.get(), bytes, cudaMemcpyDeviceToDevice, stream));
  chain(true, stream);
  TPD_CUDA(cudaMemcpyAsync(with_pdl.get(), result.get(), bytes, cudaMemcpyDeviceToDevice, stream));
  TPD_CUDA(cudaStreamSynchronize(stream));
  EXPECT_EQ(count_differences(with_pdl.get(), without.get(), m * kDim), 0u) << "eager chain";
  EXPECT_GT(nonzero(without), m * kDim / 2);

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

}  // namespace
}  // namespace tpdecode
