// The wgmma engine launched directly, in both forms (the weight as wgmma's A; the
// wide form, the weight as B), at every built (sub-tiles, token tile), split,
// cluster count and ring depth: its error against the FP64 reference no worse than
// cuBLAS's on the same inputs (plus the stated slack), every output element
// written, bitwise repeatable, and the same bits for every launch shape that keeps
// the split (the sum's order depends on the split alone).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "gemm/gemm_tactic.hpp"
#include "gemm/wgmma_launch.hpp"
#include "gemm/wgmma_plan.hpp"
#include "gpu/gemm_problem.hpp"

namespace tpdecode {
namespace {

using namespace test;  // the GEMM test helpers (gemm_problem.hpp)

constexpr int kMaxSmem = 227 * 1024;

// Runs out = x[:m] * W^T with the engine at shape `s` (clusters, stages as given).
void run(const Problem& p, int m, const WgmmaShape& s, void* out, cudaStream_t stream, bool pdl = false) {
  const CUtensorMap map = wgmma_tile_map(p.w.get(), p.n, p.k, s.rows());
  WgmmaParams params{};
  params.x = p.x.get();
  params.out = out;
  params.m = m;
  params.n = p.n;
  params.k = p.k;
  params.out_stride = p.n;
  params.blocks = (p.n + s.rows() - 1) / s.rows();
  params.chunks = static_cast<int>(p.k / wgmma::kChunkK);
  launch_wgmma(map, params, s, pdl, stream);
}

struct Case {
  WgmmaShape shape;
  int m;
};

// The launch shapes checked for one weight: every built (form, sub-tiles, tokens),
// each at up to three row counts it serves, splits 1, 2, 3 and 8 where K allows, all
// resident clusters and fewer (so that clusters loop over several blocks), the
// deepest ring and the shallowest.
std::vector<Case> cases(int64_t n, int64_t k, std::mt19937_64& rng) {
  std::vector<Case> out;
  const int chunks = static_cast<int>(k / wgmma::kChunkK);
  std::vector<WgmmaShape> kinds;  // (form, block, token tile) of every built kernel
  for (int sub : {1, 2, 4})
    for (int tokens : {8, 16, 32, 64})
      if (wgmma_shape_built(sub, tokens)) kinds.push_back({.sub_tiles = sub, .tokens = tokens});
  for (int rows : wgmma::kWideRows) kinds.push_back({.sub_tiles = rows / 8, .tokens = 64, .wide = true});
  for (const WgmmaShape& kind : kinds) {
    const int64_t blocks = (n + kind.rows() - 1) / kind.rows();
    for (int split : {1, 2, 3, 8}) {
      if (split > chunks) continue;
      if (small() && split != 1 && split != 3) continue;  // a CTA alone, and a cluster's reduction
      const int deepest = kind.wide ? wgmma::wide_stages_within(kind.rows(), split, kMaxSmem)
                                    : wgmma::stages_within(kind.sub_tiles, kind.tokens, kMaxSmem);
      if (deepest == 0) continue;  // the wide form's partials leave too little room for a ring
      for (int stages : {deepest, wgmma::kMinStages}) {
        if (quick() && stages != deepest) continue;
        WgmmaShape s = kind;
        s.split = split;
        s.stages = stages;
        const int resident = wgmma_resident_clusters(s);
        if (resident <= 0) {
          ADD_FAILURE() << "no cluster of " << split << " fits: " << s.rows() << " rows, " << s.tokens << " tokens, "
                        << stages << " stages";
          continue;
        }
        for (int64_t clusters : {std::min<int64_t>(blocks, resident), std::min<int64_t>(blocks, 3)}) {
          s.clusters = static_cast<int>(clusters);
          const int lower = s.wide ? kWideMinRows + 1 : s.tokens == 8 ? 1 : s.tokens / 2 + 1;
          std::uniform_int_distribution<int> pick(lower, s.tokens);
          if (small()) {
            out.push_back({s, pick(rng)});
            break;  // one cluster count
          }
          for (int m : {lower, pick(rng), s.tokens}) out.push_back({s, m});
        }
      }
    }
  }
  return out;
}

TEST(WgmmaEngine, EveryLaunchShapeAgreesWithTheReference) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  CublasContext cublas;
  std::vector<std::pair<int64_t, int64_t>> shapes = {{80, 1024}};
  if (!small()) shapes.insert(shapes.end(), {{16, 128}, {1000, 640}, {2112, 7168}, {7168, 1536}});
  if (!quick() && !small()) shapes.insert(shapes.end(), {{2304, 1536}, {896, 35840}, {4608, 7168}, {4160, 2112 * 2}});
  for (const auto& [n, k] : shapes) {
    Problem p(n, k, rng);
    // The bits of each (m, split, tokens, form): every other launch shape must give them.
    std::map<std::tuple<int, int, int, bool>, std::vector<uint16_t>> bits;
    for (const Case& c : cases(n, k, rng)) {
      const WgmmaShape& s = c.shape;
      SCOPED_TRACE(testing::Message() << n << "x" << k << " M " << c.m << ": " << (s.wide ? "wide, " : "")
                                      << s.rows() << " rows, "
                                      << s.tokens << " tokens, split " << s.split << ", " << s.clusters
                                      << " clusters, " << s.stages << " stages");
      const std::size_t bytes = static_cast<std::size_t>(c.m * n) * 2;
      DeviceBuffer out(bytes), again(bytes), base(bytes);
      poison(out);
      poison(again);
      run(p, c.m, s, out.get(), nullptr);
      TPD_CUDA(cudaGetLastError());
      // Small mode (racecheck's runs) skips cuBLAS's baseline: racecheck would
      // instrument cuBLAS's kernels too, and the engine's are what it checks.
      if (!small()) cublas.gemm(p.rows(c.m), p.weight(), TensorView::bf16(base.get(), c.m, n), nullptr);
      run(p, c.m, s, again.get(), nullptr);
      TPD_CUDA(cudaDeviceSynchronize());
      const std::vector<uint16_t> got = to_host<uint16_t>(out, bytes / 2);
      ASSERT_EQ(std::count(got.begin(), got.end(), kPoison16), 0) << "output elements left unwritten";
      const double ours = p.error(out, c.m);
      if (!small()) {
        const double theirs = p.error(base, c.m);
        EXPECT_LE(ours, theirs * (1 + kRelSlack) + kAbsSlack) << "cuBLAS " << theirs;
      }
      ASSERT_LT(ours, 1e-2);
      ASSERT_EQ(count_differences(out.get(), again.get(), c.m * n), 0u) << "a second run differs";
      const auto [it, first] = bits.try_emplace({c.m, s.split, s.tokens, s.wide}, got);
      if (!first) EXPECT_TRUE(it->second == got) << "another launch shape with this split gave other bits";
    }
  }
}

// A row's bits do not depend on the token tile it runs in, nor on how many other
// rows the call carries: what a batch-invariant mode needs from a fixed split.
TEST(WgmmaEngine, RowBitsDoNotDependOnTheTokenTile) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  Problem p(2112, 7168, rng);
  for (int split : {1, 4}) {
    std::vector<uint16_t> first_rows;  // rows 0..7 as the 8-token tile computes them
    for (int tokens : {8, 16, 32, 64}) {
      WgmmaShape s;
      s.tokens = tokens;
      s.split = split;
      s.stages = wgmma::stages_within(1, tokens, kMaxSmem);
      s.clusters = std::min(33, wgmma_resident_clusters(1, tokens, split, s.stages));
      DeviceBuffer out(static_cast<std::size_t>(tokens * p.n) * 2);
      run(p, tokens, s, out.get(), nullptr);
      TPD_CUDA(cudaDeviceSynchronize());
      std::vector<uint16_t> rows = to_host<uint16_t>(out, static_cast<std::size_t>(8 * p.n));
      if (first_rows.empty())
        first_rows = rows;
      else
        EXPECT_TRUE(rows == first_rows) << "split " << split << ": rows 0-7 at " << tokens << " tokens differ";
    }
  }
}

// Links reading the previous link's output, launched with PDL (each requests its
// weights before waiting for the previous kernel), give the bits of the same chain
// without PDL.
TEST(WgmmaEngine, PdlChainMatchesTheChainWithout) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  constexpr int64_t kDim = 2048;
  constexpr int kLinks = 6;
  const int m = 5;
  std::vector<DeviceBuffer> weights;
  std::vector<CUtensorMap> maps;
  for (int i = 0; i < kLinks; ++i) {
    weights.emplace_back(static_cast<std::size_t>(kDim * kDim) * 2);
    fill_uniform(weights.back().get(), kDim * kDim, rng, nullptr, 1.0f / 32);
    maps.push_back(wgmma_tile_map(weights.back().get(), kDim, kDim, 64 * (1 + i % 2)));
  }
  const std::size_t bytes = static_cast<std::size_t>(m * kDim) * 2;
  DeviceBuffer input(bytes), ping(bytes), pong(bytes), without(bytes);
  fill_uniform(input.get(), m * kDim, rng);
  TPD_CUDA(cudaDeviceSynchronize());
  cudaStream_t stream;
  TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto chain = [&](bool pdl) {
    TPD_CUDA(cudaMemcpyAsync(ping.get(), input.get(), bytes, cudaMemcpyDeviceToDevice, stream));
    for (int i = 0; i < kLinks; ++i) {
      WgmmaShape s;
      s.sub_tiles = 1 + i % 2;
      s.split = 1 + i % 4;
      s.stages = wgmma::stages_within(s.sub_tiles, 8, kMaxSmem);
      s.clusters = std::min<int>(kDim / (64 * s.sub_tiles), wgmma_resident_clusters(s.sub_tiles, 8, s.split, s.stages));
      WgmmaParams params{};
      params.x = (i % 2 ? pong : ping).get();
      params.out = (i % 2 ? ping : pong).get();
      params.m = m;
      params.n = kDim;
      params.k = kDim;
      params.out_stride = kDim;
      params.blocks = kDim / (64 * s.sub_tiles);
      params.chunks = kDim / 64;
      launch_wgmma(maps[static_cast<std::size_t>(i)], params, s, pdl, stream);
    }
  };
  const DeviceBuffer& result = kLinks % 2 ? pong : ping;
  chain(false);
  TPD_CUDA(cudaMemcpyAsync(without.get(), result.get(), bytes, cudaMemcpyDeviceToDevice, stream));
  for (int round = 0; round < (quick() ? 3 : 20); ++round) {
    poison(ping, stream);
    poison(pong, stream);
    chain(true);
    TPD_CUDA(cudaStreamSynchronize(stream));
    ASSERT_EQ(count_differences(result.get(), without.get(), m * kDim), 0u) << "round " << round;
  }
  const std::vector<uint16_t> host = to_host<uint16_t>(without, bytes / 2);
  EXPECT_GT(std::count_if(host.begin(), host.end(), [](uint16_t v) { return (v & 0x7fff) != 0; }), m * kDim / 2);
  TPD_CUDA(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace tpdecode
