// DecodeGemm's dispatch on the GPU: the tuner times the candidates on the real
// weight and keeps one (reused by the next DecodeGemm of the shape), ranks agree
// through the hook and replicated GEMMs match bitwise, what no engine takes runs on
// cuBLAS, bad input is refused, and without tuning the static rule runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/bf16.hpp"
#include "core/random_fill.hpp"
#include "gemm/gemm_tactic.hpp"
#include "gpu/gemm_problem.hpp"
#include "reference/gemm.hpp"
#include "tpdecode/decode_gemm.hpp"

namespace tpdecode {
namespace {

using namespace test;  // the GEMM test helpers (gemm_problem.hpp)

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
  // Phase 2 re-timed at most 4 finalists in at most 6 rounds (none with one finalist).
  EXPECT_GE(d.tune_finalists, 1);
  EXPECT_LE(d.tune_finalists, 4);
  EXPECT_LE(d.tune_rounds, 6);
  EXPECT_EQ(d.tune_rounds == 0, d.tune_finalists == 1);
  std::cout << "[ tuned    ] 4608x7168 M " << m << ": " << describe(d) << ", " << d.measured_us << " us, tuning took "
            << d.tune_ms << " ms over " << candidates.size() << " candidates; " << int{d.tune_finalists}
            << " finalists re-timed in " << int{d.tune_rounds} << " rounds, " << (d.tune_stable ? "stable" : "not stable")
            << "\n";

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
  TPD_CUDA(cudaDeviceSynchronize());  // the fills ran on the legacy stream; the ranks' streams do not wait for it
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
  for (GemmPath p : undecided) EXPECT_EQ(p, rule_decision(n, k, 20, sms, {true}).path);
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

// Alone, the tuner times every split 1 .. 8 of both engines; for ranks sharing the
// GPU, the powers of two only, under a key of their own.
TEST(DecodeGemm, SharedGpuTimesThePowerOfTwoSplits) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  Problem p(2112, 7168, rng);
  DecodeGemm gemm(p.weight(), nullptr, private_tuner(true));
  // The splits of one engine's candidates of one shape: the wgmma engine's 64-row
  // tiles with the half-SM ring, the warp engine's CTAs of `row_tiles` tiles (in the
  // tensor-map form or not).
  auto splits = [&](GemmPath path, int row_tiles = kWarpWarps, bool tensor_map = false) {
    std::vector<int> s;
    for (const GemmDecision& d : gemm.candidates(4))
      if (d.path == path && (path == GemmPath::kWgmma ? d.sub_tiles == 1 && d.stages < 20
                                                      : d.sub_tiles == row_tiles && warp_tensor_map(d) == tensor_map))
        s.push_back(d.split);
    return s;
  };
  const std::vector<int> every = {1, 2, 3, 4, 5, 6, 7, 8}, powers = {1, 2, 4, 8};
  EXPECT_EQ(splits(GemmPath::kWarpSplitK), every);
  EXPECT_EQ(splits(GemmPath::kWarpSplitK, 1), every);
  EXPECT_EQ(splits(GemmPath::kWarpSplitK, 1, true), every);
  EXPECT_EQ(splits(GemmPath::kWgmma), every);
  const GemmKey alone = gemm.key(4);
  gemm.set_sharing(8);
  EXPECT_EQ(splits(GemmPath::kWarpSplitK), powers);
  EXPECT_EQ(splits(GemmPath::kWarpSplitK, 1), powers);
  EXPECT_EQ(splits(GemmPath::kWarpSplitK, 1, true), powers);
  EXPECT_EQ(splits(GemmPath::kWgmma), powers);
  EXPECT_FALSE(gemm.key(4) == alone);
  gemm.prepare(4);
  EXPECT_TRUE(warp_split_for_shared_gpu(gemm.decision(4).split));
  EXPECT_THROW(gemm.set_sharing(0), InvalidArgument);
}

// Links decided as one chain (decide_adjacent), from decisions planted in the tuner
// (no timing): an engine link between stock links takes its stock decision alone,
// among engine links it keeps its own; a link not marked as a chain link is refused.
TEST(DecodeGemm, AdjacentLinksAreDecidedAsAChain) {
  TPD_REQUIRE_GPU();
  auto tuner = private_tuner(false);
  const int m = 8;
  auto measured = [](GemmDecision d, float us) {
    d.source = GemmSource::kTuned;
    d.measured_us = us;
    return d;
  };
  std::vector<DeviceBuffer> weights;
  // A chain link of shape n x k whose chain decision is `chain` and (if given) whose
  // decision alone is `alone`.
  auto link = [&](int64_t n, int64_t k, const GemmDecision& chain, std::optional<GemmDecision> alone) {
    weights.emplace_back(static_cast<std::size_t>(n * k) * 2);
    auto g = std::make_unique<DecodeGemm>(TensorView::bf16(weights.back().get(), n, k), nullptr, tuner);
    g->set_chain(true);
    tuner->insert(g->key(m), chain);
    if (alone) {
      GemmKey key = g->key(m);
      key.chain = false;
      tuner->insert(key, *alone);
    }
    return g;
  };
  const GemmDecision engine = measured(warp_decision(4), 9.4f), stock_alone = measured(cublas_decision(), 8.5f);
  const GemmDecision stock_link = measured(cublas_decision(), 14.0f);  // charged: 12 + 2
  const GemmDecision engine_link = measured(warp_decision(2), 7.0f);
  {
    auto before = link(4096, 2048, stock_link, std::nullopt);
    auto middle = link(4096, 4096, engine, stock_alone);
    auto after = link(2048, 4096, stock_link, std::nullopt);
    DecodeGemm::decide_adjacent({before.get(), middle.get(), after.get()}, m);
    EXPECT_EQ(middle->decision(m).path, GemmPath::kCublas);
    EXPECT_EQ(before->decision(m).path, GemmPath::kCublas);
    EXPECT_EQ(middle->path(m), GemmPath::kCublas);
  }
  {
    auto before = link(3072, 2048, engine_link, std::nullopt);
    auto middle = link(4096, 4096, engine, stock_alone);  // the same shape: the same planted decisions
    auto after = link(2048, 3072, engine_link, std::nullopt);
    DecodeGemm::decide_adjacent({before.get(), middle.get(), after.get()}, m);
    EXPECT_TRUE(middle->decision(m).same_path(engine));
    EXPECT_TRUE(before->decision(m).same_path(engine_link));
    EXPECT_EQ(middle->path(m), GemmPath::kWarpSplitK);
    auto alone = link(1024, 2048, engine_link, std::nullopt);
    alone->set_chain(false);
    EXPECT_THROW(DecodeGemm::decide_adjacent({before.get(), alone.get()}, m), InvalidArgument);
  }
}

// Where the assignments differ, the chain itself is timed: a planted chain decision
// that claims 1 us but streams a 64 x 65536 weight through four 16-row CTAs (tens of
// us) loses to its planted alone decision (cuBLAS, claimed 100 us), which the
// boundary model alone would never take; with tuning off, the model's choice stays.
TEST(DecodeGemm, AdjacentLinksAreTimedAsTheChainWhereTheyDiffer) {
  TPD_REQUIRE_GPU();
  const int m = 4;
  const int64_t n = 64, k = 65536;
  DeviceBuffer weight(static_cast<std::size_t>(n * k) * 2);
  fill_uniform_bf16(weight.get(), n * k, 11, 1.0f, nullptr);
  for (const bool tuning : {true, false}) {
    auto tuner = private_tuner(tuning);
    DecodeGemm g(TensorView::bf16(weight.get(), n, k), nullptr, tuner);
    g.set_chain(true);
    GemmDecision slow = warp_decision(1, 1), stock = cublas_decision();
    slow.source = stock.source = GemmSource::kTuned;
    slow.measured_us = 1.0f;
    stock.measured_us = 100.0f;
    tuner->insert(g.key(m), slow);
    GemmKey alone = g.key(m);
    alone.chain = false;
    tuner->insert(alone, stock);
    DecodeGemm::decide_adjacent({&g}, m);
    EXPECT_EQ(g.path(m), tuning ? GemmPath::kCublas : GemmPath::kWarpSplitK) << "tuning " << tuning;
  }
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
    auto [wh, w] = dense(2120, 480, 480, 0);  // N % 16 != 0 and K % 64 != 0
    auto [xh, x] = dense(4, 480, 480, 0);
    expect_fallback(TensorView::bf16(w.get(), 2120, 480), TensorView::bf16(x.get(), 4, 480), wh, xh, "K % 64");
  }
  {
    auto [wh, w] = dense(256, 1000, 1000, 0);  // K % 128 != 0
    auto [xh, x] = dense(4, 1000, 1000, 0);
    expect_fallback(TensorView::bf16(w.get(), 256, 1000), TensorView::bf16(x.get(), 4, 1000), wh, xh, "K % 128");
  }
  auto [wh, w] = dense(512, 1024, 1024, 0);
  const TensorView wv = TensorView::bf16(w.get(), 512, 1024);
  {
    auto [xh, x] = dense(65, 1024, 1024, 0);
    expect_fallback(wv, TensorView::bf16(x.get(), 65, 1024), wh, xh, "M = 65");
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
  // Undecided: the static rule's path, or cuBLAS while its engine is not prepared in
  // this process.
  const GemmPath undecided = gemm.path(4);
  EXPECT_TRUE(undecided == GemmPath::kCublas || undecided == rule_decision(512, 1024, 4, sm_count(), {true}).path)
      << gemm_path_name(undecided);
  EXPECT_THROW(gemm.decision(4), InvalidArgument);
  gemm.force(4, warp_decision(2));
  EXPECT_EQ(gemm.path(4), GemmPath::kWarpSplitK);
  EXPECT_EQ(gemm.path(3), GemmPath::kWarpSplitK);  // same bucket
  EXPECT_EQ(gemm.path(33), GemmPath::kCublas);  // undecided above 32 rows: the rule's cuBLAS
  EXPECT_EQ(gemm.path(65), GemmPath::kCublas);
  EXPECT_THROW(gemm.force(4, warp_decision(5)), InvalidArgument);  // 8 chunks of K: two per CTA at most split 4
  EXPECT_THROW(gemm.force(4, warp_decision(9)), InvalidArgument);  // clusters hold 8 CTAs at most
  EXPECT_THROW(gemm.force(65, warp_decision(1)), InvalidArgument);  // the engines take 64 rows
  EXPECT_THROW(gemm.force(65, wgmma_decision(1, 1, 4)), InvalidArgument);
  EXPECT_THROW(gemm.force(20, wgmma_decision(1, 4, 5)), InvalidArgument);  // 4 sub-tiles: 16 tokens at most
  gemm.force(40, wgmma_decision(2, 1, 4));
  EXPECT_EQ(gemm.path(40), GemmPath::kWgmma);
  EXPECT_EQ(gemm.path(33), GemmPath::kWgmma);  // same bucket
  EXPECT_GT(gemm.decision(40).clusters, 0);    // resolved for this GPU
  EXPECT_LE(gemm.decision(40).clusters, 8);    // 512 rows: 8 blocks of 64
}

// With tuning off, the dispatch is the static rule: the warp engine where its model
// beats cuBLAS's, else cuBLAS.
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

namespace {

// A batch-invariant GEMM's rows have the same bits whether each runs alone or at any
// position of a call of up to 64 rows, eagerly and in a graph, and every bucket runs
// decision(1)'s summation order (its path returned by every call).
void expect_rows_keep_their_bits(DecodeGemm& gemm, const Problem& p) {
  const int64_t n = p.n, k = p.k;
  const GemmDecision order = gemm.decision(1);
  const GemmPath path = order.path;
  std::vector<std::vector<uint16_t>> alone(kProblemRows);
  DeviceBuffer one(static_cast<std::size_t>(n) * 2);
  for (int r = 0; r < kProblemRows; ++r) {
    const TensorView row = TensorView::bf16(p.x.as<uint16_t>() + r * k, 1, k);
    ASSERT_EQ(gemm.run(row, TensorView::bf16(one.get(), 1, n), nullptr), path);
    alone[static_cast<std::size_t>(r)] = to_host<uint16_t>(one, static_cast<std::size_t>(n));
  }
  for (int m : {2, 5, 8, 9, 16, 17, 31, 32, 33, 48, 49, 64}) {
    EXPECT_TRUE(same_summation_order(gemm.decision(m), order)) << m << ": " << describe(gemm.decision(m));
    DeviceBuffer out(static_cast<std::size_t>(m * n) * 2);
    poison(out);
    ASSERT_EQ(gemm.run(p.rows(m), TensorView::bf16(out.get(), m, n), nullptr), path) << m;
    TPD_CUDA(cudaDeviceSynchronize());
    const std::vector<uint16_t> got = to_host<uint16_t>(out, static_cast<std::size_t>(m * n));
    for (int r = 0; r < m; ++r)
      ASSERT_TRUE(std::equal(alone[static_cast<std::size_t>(r)].begin(), alone[static_cast<std::size_t>(r)].end(),
                             got.begin() + r * n))
          << "row " << r << " of " << m << " differs from the row alone";
    EXPECT_LT(p.error(out, m), 1e-2);
  }
  // Under capture (every bucket was prepared by set_batch_invariant).
  cudaStream_t stream;
  TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer captured(static_cast<std::size_t>(40 * n) * 2);
  cudaGraph_t graph;
  TPD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  EXPECT_EQ(gemm.run(p.rows(40), TensorView::bf16(captured.get(), 40, n), stream), path);
  TPD_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  TPD_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  poison(captured, stream);
  TPD_CUDA(cudaGraphLaunch(exec, stream));
  TPD_CUDA(cudaStreamSynchronize(stream));
  const std::vector<uint16_t> replayed = to_host<uint16_t>(captured, static_cast<std::size_t>(40 * n));
  for (int r = 0; r < 40; ++r)
    ASSERT_TRUE(std::equal(alone[static_cast<std::size_t>(r)].begin(), alone[static_cast<std::size_t>(r)].end(),
                           replayed.begin() + r * n))
        << "replayed row " << r;
  TPD_CUDA(cudaGraphExecDestroy(exec));
  TPD_CUDA(cudaGraphDestroy(graph));
  TPD_CUDA(cudaStreamDestroy(stream));
}

}  // namespace

// Batch-invariant mode without tuning: the static invariant_decision (the warp
// engine where the rule prefers it at the rows hinted, the narrow CTA where few
// 64-row blocks leave SMs idle (its tensor-map form), else the wgmma engine), one
// order in every bucket. The narrow CTA's calls above 16 rows run as launches of 16.
TEST(DecodeGemm, BatchInvariantRowsKeepTheirBits) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  struct Case {
    int64_t n, k;
    int rows;
    GemmPath path;
    int row_tiles;  // of a warp decision
  };
  for (const auto& [n, k, rows, path, row_tiles] :
       std::vector<Case>{{2112, 7168, 8, GemmPath::kWarpSplitK, kWarpWarps},
                         {2112, 7168, 64, GemmPath::kWgmma, 0},
                         {7168, 1536, 8, GemmPath::kWarpSplitK, kWarpWarps},
                         {18432, 1536, 8, GemmPath::kWarpSplitK, kWarpWarps},  // split 1
                         {896, 35840, 8, GemmPath::kWarpSplitK, 1},  // the rule: cuBLAS; 14 blocks of 64 rows
                         {896, 35840, 64, GemmPath::kWgmma, 0},
                         {1000, 640, 8, GemmPath::kWgmma, 0}}) {  // N % 16
    SCOPED_TRACE(testing::Message() << n << "x" << k << " for " << rows << " rows");
    Problem p(n, k, rng);
    DecodeGemm gemm(p.weight(), nullptr, private_tuner(false));
    gemm.set_batch_invariant(true, rows == 8 ? 1 : 8);
    gemm.set_batch_invariant(true, rows);  // a new hint: decided again
    ASSERT_TRUE(gemm.batch_invariant());
    ASSERT_EQ(gemm.batch_invariant_rows(), rows);
    EXPECT_EQ(gemm.decision(1).path, path);
    EXPECT_EQ(gemm.decision(1).source, GemmSource::kRule);
    if (path == GemmPath::kWarpSplitK) EXPECT_EQ(int{gemm.decision(1).sub_tiles}, row_tiles);
    if (path == GemmPath::kWarpSplitK) EXPECT_EQ(warp_tensor_map(gemm.decision(1)), row_tiles == 1);  // its faster form
    EXPECT_THROW(gemm.force(4, warp_decision(1)), InvalidArgument);
    expect_rows_keep_their_bits(gemm, p);
    // Rows 2 K apart: cuBLAS would take them, with other bits than the order's.
    const TensorView strided{p.x.get(), DType::kBF16, 2, k, 2 * k};
    DeviceBuffer two(static_cast<std::size_t>(2 * n) * 2);
    EXPECT_THROW(gemm.run(strided, TensorView::bf16(two.get(), 2, n), nullptr), InvalidArgument);
    gemm.set_batch_invariant(false);
    EXPECT_FALSE(gemm.prepared(4));
    EXPECT_EQ(gemm.run(strided, TensorView::bf16(two.get(), 2, n), nullptr), GemmPath::kCublas);
  }
  // A weight neither engine takes is refused.
  DeviceBuffer w(256 * 1000 * 2);
  DecodeGemm odd(TensorView::bf16(w.get(), 256, 1000), nullptr, private_tuner(false));
  EXPECT_THROW(odd.set_batch_invariant(true), InvalidArgument);
}

// With tuning, the order is the fastest of invariant_candidates at the hint's
// bucket, made once per shape and hint (a second GEMM of the shape finds it), and
// rows keep their bits under it.
TEST(DecodeGemm, BatchInvariantTunedOrderKeepsTheBits) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  for (const auto& [n, k, rows] : std::vector<std::tuple<int64_t, int64_t, int>>{
           {896, 35840, 8}, {2112, 7168, 1}, {9216, 7168, 8}, {1536, 7168, 64}, {1000, 640, 8}}) {
    SCOPED_TRACE(testing::Message() << n << "x" << k << " for " << rows << " rows");
    Problem p(n, k, rng);
    auto tuner = private_tuner(true);
    DecodeGemm gemm(p.weight(), nullptr, tuner);
    gemm.set_batch_invariant(true, rows);
    const GemmDecision order = gemm.decision(1);
    EXPECT_EQ(order.source, GemmSource::kTuned);
    const auto candidates = invariant_candidates(n, k, rows, {warp_weight_ok(p.weight()), true}, false);
    EXPECT_TRUE(std::any_of(candidates.begin(), candidates.end(),
                            [&](const GemmDecision& c) { return same_summation_order(c, order); }))
        << describe(order);
    EXPECT_GT(gemm.decision(rows).measured_us, 0.0f);  // the hint's bucket carries the time
    DecodeGemm again(p.weight(), nullptr, tuner);
    again.set_batch_invariant(true, rows);
    EXPECT_EQ(again.decision(1).source, GemmSource::kTuned);  // from the tuner's memory, not timed again
    EXPECT_TRUE(same_summation_order(again.decision(1), order));
    expect_rows_keep_their_bits(gemm, p);
  }
}

// Where ranks share the GPU, a batch-invariant GEMM decides again among the powers
// of two, and its rows keep their bits across row counts under the new decision.
TEST(DecodeGemm, BatchInvariantDecidesAgainWhereRanksShareTheGpu) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  Problem p(7168, 2304, rng);
  DecodeGemm gemm(p.weight(), nullptr, private_tuner(false));
  gemm.set_batch_invariant(true);
  ASSERT_EQ(gemm.decision(1).path, GemmPath::kWarpSplitK);
  EXPECT_EQ(gemm.decision(1).split, 3);  // the rule's split at 8 rows
  gemm.set_sharing(8);
  ASSERT_TRUE(gemm.batch_invariant());
  const int split = gemm.decision(1).split;
  EXPECT_TRUE(warp_split_for_shared_gpu(split)) << split;
  DeviceBuffer one(7168 * 2), many(17 * 7168 * 2);
  for (int m = 1; m <= kGemmMaxRows; m += 8) EXPECT_EQ(gemm.decision(m).split, split) << m;
  ASSERT_EQ(gemm.run(p.rows(1), TensorView::bf16(one.get(), 1, 7168), nullptr), GemmPath::kWarpSplitK);
  poison(many);
  ASSERT_EQ(gemm.run(p.rows(17), TensorView::bf16(many.get(), 17, 7168), nullptr), GemmPath::kWarpSplitK);
  TPD_CUDA(cudaDeviceSynchronize());
  const std::vector<uint16_t> alone = to_host<uint16_t>(one, 7168);
  const std::vector<uint16_t> in_17 = to_host<uint16_t>(many, 17 * 7168);
  EXPECT_TRUE(std::equal(alone.begin(), alone.end(), in_17.begin())) << "row 0 alone and among 17 differ";
  EXPECT_LT(p.error(many, 17), 1e-2);
  // A hint out of range changes nothing; turning the mode off reads no hint.
  EXPECT_THROW(gemm.set_batch_invariant(true, kGemmMaxRows + 1), InvalidArgument);
  EXPECT_TRUE(gemm.batch_invariant());
  EXPECT_EQ(gemm.decision(1).split, split);
  EXPECT_NO_THROW(gemm.set_batch_invariant(false, 0));
  EXPECT_FALSE(gemm.batch_invariant());
  EXPECT_FALSE(gemm.prepared(1));
}

}  // namespace
}  // namespace tpdecode
