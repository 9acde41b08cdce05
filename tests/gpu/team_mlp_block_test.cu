// TeamMlpBlock on local teams of 2, 4 and 8 ranks (one GPU): every rank's shards of
// one block (o_proj and down row-parallel, gate_up and qkv column-parallel), with
// and without o_proj and qkv, against the CPU reference of the sharded block (each
// partial rounded as the program stores it, summed as the one-shot all-reduce,
// FP64 norms and GEMMs), in both forms (the program, the launches); every rank's
// residual stream the same bits (and out, where it is the next norm's); a repeat run
// and a graph's replays give the same bits; the default form; refusals.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "gpu/gpu_test_util.hpp"
#include "gpu/mlp_block_reference.hpp"
#include "gpu/program_reference.hpp"
#include "reference/all_reduce.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/local_team.hpp"
#include "tpdecode/team_mlp_block.hpp"

namespace tpdecode {
namespace {

using namespace test;

// The whole block's widths; a rank holds A / tp, I / tp and Q / tp of them.
constexpr int64_t kH = 1024, kI = 2048, kA = 1024, kQ = 1024;
constexpr float kEps = 1e-6f;

TensorView view(const DeviceBuffer& b, int64_t rows, int64_t cols) { return TensorView::bf16(b.get(), rows, cols); }

struct RankShards {
  std::vector<uint16_t> wo, wgu, wd, wq, attn;
  DeviceBuffer wo_d, wgu_d, wd_d, wq_d, attn_d, residual_d, out_d;
};

// One block's shards on every rank of a team of tp, m rows.
struct ShardedBlock {
  int tp, m;
  bool o_proj, qkv;
  int64_t a, inter, q;  // per rank: attn's width (A / tp, or H without o_proj), I / tp, out's width
  std::vector<uint16_t> g1, g2, residual;
  DeviceBuffer g1_d, g2_d, residual0_d;
  std::vector<RankShards> ranks;

  ShardedBlock(int tp_, int m_, bool o_proj_, bool qkv_, std::mt19937_64& rng)
      : tp(tp_), m(m_), o_proj(o_proj_), qkv(qkv_), a(o_proj_ ? kA / tp_ : kH), inter(kI / tp_),
        q(qkv_ ? kQ / tp_ : kH), ranks(static_cast<std::size_t>(tp_)) {
    auto weight = [&](int64_t n, int64_t k, float scale) {
      return random_bf16(static_cast<std::size_t>(n * k), rng, scale);
    };
    g1 = random_bf16(kH, rng);
    g2 = random_bf16(kH, rng);
    g1_d = to_device(g1);
    g2_d = to_device(g2);
    residual = random_bf16(static_cast<std::size_t>(m * kH), rng, 2.0f);
    residual0_d = to_device(residual);
    for (RankShards& r : ranks) {
      r.wo = weight(kH, a, 0.05f);
      r.wgu = weight(2 * inter, kH, 0.05f);
      r.wd = weight(kH, inter, 0.05f);
      r.wq = weight(q, kH, 0.05f);
      // Without o_proj attn is the rank's partial of the attention's projection.
      r.attn = weight(m, a, o_proj ? 1.0f : 1.0f / static_cast<float>(tp));
      r.wo_d = to_device(r.wo);
      r.wgu_d = to_device(r.wgu);
      r.wd_d = to_device(r.wd);
      r.wq_d = to_device(r.wq);
      r.attn_d = to_device(r.attn);
      r.residual_d = DeviceBuffer(residual.size() * 2);
      r.out_d = DeviceBuffer(static_cast<std::size_t>(m * q) * 2);
    }
    restart();
  }

  // Every rank's residual back to the block's input, its out poisoned.
  void restart(const Team* team = nullptr) {
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      cudaStream_t s = team ? team->stream(static_cast<int>(i)) : nullptr;
      TPD_CUDA(cudaMemcpyAsync(ranks[i].residual_d.get(), residual0_d.get(), residual.size() * 2,
                               cudaMemcpyDeviceToDevice, s));
      poison(ranks[i].out_d, s);
    }
    if (!team) TPD_CUDA(cudaDeviceSynchronize());
  }

  std::vector<TeamMlpBlock::Weights> weights() const {
    std::vector<TeamMlpBlock::Weights> w;
    for (const RankShards& r : ranks)
      w.push_back({o_proj ? view(r.wo_d, kH, a) : TensorView{}, view(g1_d, 1, kH), view(r.wgu_d, 2 * inter, kH),
                   view(r.wd_d, kH, inter), view(g2_d, 1, kH), qkv ? view(r.wq_d, q, kH) : TensorView{}, kEps});
    return w;
  }
  std::vector<TeamMlpBlock::Buffers> buffers() const {
    std::vector<TeamMlpBlock::Buffers> b;
    for (const RankShards& r : ranks) b.push_back({view(r.attn_d, m, a), view(r.residual_d, m, kH), view(r.out_d, m, q)});
    return b;
  }

  // The sharded block on the CPU: each rank's out, and the residual stream.
  std::pair<std::vector<std::vector<double>>, std::vector<uint16_t>> reference() const {
    std::vector<uint16_t> stream = residual;
    std::vector<std::vector<uint16_t>> partials;
    for (const RankShards& r : ranks)
      partials.push_back(o_proj ? rounded(gemm_reference(r.attn, r.wo, m, a, kH)) : r.attn);
    const std::vector<uint16_t> h = add_norm(stream, reference::all_reduce(partials), g1, m, kEps);
    partials.clear();
    for (const RankShards& r : ranks) {
      const std::vector<uint16_t> act = silu_mul(rounded(gemm_reference(h, r.wgu, m, kH, 2 * inter)), m, inter);
      partials.push_back(rounded(gemm_reference(act, r.wd, m, inter, kH)));
    }
    const std::vector<uint16_t> h2 = add_norm(stream, reference::all_reduce(partials), g2, m, kEps);
    std::vector<std::vector<double>> outs;
    for (const RankShards& r : ranks) outs.push_back(qkv ? gemm_reference(h2, r.wq, m, kH, q) : values(h2));
    return {outs, stream};
  }

  std::vector<uint16_t> out(int i) const {
    return to_host<uint16_t>(ranks[static_cast<std::size_t>(i)].out_d, static_cast<std::size_t>(m * q));
  }
  std::vector<uint16_t> stream(int i) const {
    return to_host<uint16_t>(ranks[static_cast<std::size_t>(i)].residual_d, residual.size());
  }
};

// Bare blocks (no o_proj, no qkv; one set of unfilled weights for every rank) of H h
// and I / tp inter on every rank of a team of tp, m rows: for tests that build blocks
// and read no value.
struct BareBlocks {
  DeviceBuffer g, gu, d;
  std::vector<DeviceBuffer> io;
  std::vector<TeamMlpBlock::Weights> w;
  std::vector<TeamMlpBlock::Buffers> b;

  BareBlocks(int tp, int64_t h, int64_t inter, int m) : g(h * 2), gu(2 * inter * h * 2), d(h * inter * 2) {
    for (int i = 0; i < tp; ++i) {
      for (int j = 0; j < 3; ++j) io.emplace_back(static_cast<std::size_t>(m * h) * 2);
      w.push_back({{}, view(g, 1, h), view(gu, 2 * inter, h), view(d, h, inter), view(g, 1, h), {}, kEps});
      b.push_back({view(io[io.size() - 3], m, h), view(io[io.size() - 2], m, h), view(io.back(), m, h)});
    }
  }
};

TEST(TeamMlpBlock, EveryRankGivesTheShardedBlocksReference) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  using Form = TeamMlpBlock::Form;
  for (int tp : {2, 4, 8}) {
    LocalTeam team(tp);
    for (int m : {1, 5, 16, 40}) {
      if (quick() && m != 5 && !(tp == 2 && m == 40)) continue;
      for (const Form form : {Form::kProgram, Form::kLaunches}) {
        // Quick: the launches (each GEMM decided for m rows) at TP 2 and 8 only.
        if (quick() && form == Form::kLaunches && tp == 4) continue;
        for (const bool full : {true, false}) {  // o_proj and qkv, or neither
          SCOPED_TRACE(testing::Message() << "local TP " << tp << ", m " << m << (full ? ", o_proj + qkv" : ", bare")
                                          << (form == Form::kProgram ? ", program" : ", launches"));
          ShardedBlock block(tp, m, full, full, rng);
          const std::vector<TeamMlpBlock::Weights> weights = block.weights();
          const std::vector<TeamMlpBlock::Buffers> buffers = block.buffers();
          const TeamMlpBlock program(team, weights, buffers, m, form);
          EXPECT_EQ(program.form(), form);
          // The ranks share the GPU: launches by default.
          if (form == Form::kLaunches) EXPECT_EQ(TeamMlpBlock(team, weights, buffers, m).form(), form) << "default";
          if (form == Form::kLaunches) EXPECT_THROW(program.program(), InvalidArgument);
          program.run();
          team.synchronize();
          const auto [outs, stream] = block.reference();
          std::vector<std::vector<uint16_t>> first_outs;
          for (int i = 0; i < tp; ++i) {
            SCOPED_TRACE(testing::Message() << "rank " << i);
            first_outs.push_back(block.out(i));
            EXPECT_LT(relative_error(first_outs.back(), outs[static_cast<std::size_t>(i)]), 1e-2) << "out";
            // The residual's second add takes y, whose error against the FP64 chain (h's
            // roundings moved by the norm's order, through gate_up and down) is of out's
            // order; y is of the residual's size here: up to 3.6e-3 measured at one row.
            EXPECT_LT(relative_error(block.stream(i), values(stream)), 6e-3) << "the residual stream";
            EXPECT_TRUE(block.stream(i) == block.stream(0)) << "the residual stream differs from rank 0's";
            if (!full) EXPECT_TRUE(first_outs.back() == first_outs[0]) << "out (h') differs from rank 0's";
          }
          // A repeat run and two graph replays from the same input: the same bits.
          block.restart();
          program.run();
          team.synchronize();
          for (int i = 0; i < tp; ++i)
            EXPECT_TRUE(block.out(i) == first_outs[static_cast<std::size_t>(i)]) << "rank " << i;
          TeamGraph graph(team, [&] {
            block.restart(&team);
            program.run();
          });
          for (int replay = 0; replay < 2; ++replay) {
            for (RankShards& r : block.ranks) poison(r.out_d);
            TPD_CUDA(cudaDeviceSynchronize());
            graph.replay();
            team.synchronize();
            for (int i = 0; i < tp; ++i)
              EXPECT_TRUE(block.out(i) == first_outs[static_cast<std::size_t>(i)])
                  << "replay " << replay << ", rank " << i;
          }
        }
      }
    }
  }
}

TEST(TeamMlpBlock, Refusals) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  LocalTeam team(2);
  const int m = 2;
  ShardedBlock block(2, m, true, true, rng);
  const std::vector<TeamMlpBlock::Weights> weights = block.weights();
  const std::vector<TeamMlpBlock::Buffers> buffers = block.buffers();
  EXPECT_NO_THROW(TeamMlpBlock(team, weights, buffers, m));
  auto refused = [&](auto change, const char* what) {
    std::vector<TeamMlpBlock::Weights> w = weights;
    std::vector<TeamMlpBlock::Buffers> b = buffers;
    change(w, b);
    EXPECT_THROW(TeamMlpBlock(team, w, b, m), InvalidArgument) << what;
  };
  using W = std::vector<TeamMlpBlock::Weights>;
  using B = std::vector<TeamMlpBlock::Buffers>;
  refused([](W& w, B&) { w.pop_back(); }, "one weight set for two ranks");
  refused([](W& w, B&) { w[1].next_norm = w[1].qkv = {}; }, "no next norm");
  refused([](W& w, B&) { w[1].down.cols -= 64; }, "rank 1's down does not chain");
  refused(
      [&](W& w, B& b) {  // rank 1 with a narrower I / tp than rank 0's
        w[1].gate_up.rows /= 2;
        w[1].down.cols /= 2;
        (void)b;
      },
      "I / tp differs between ranks");
  refused([](W&, B& b) { b[1].residual = b[0].residual; }, "one residual for two ranks");
  refused([](W&, B& b) { b[1].attn = TensorView::bf16(b[0].out.data, b[1].attn.rows, b[1].attn.cols); },
          "rank 1 reads what rank 0 writes");
}

// A model's layers as launch-form blocks on one team: they share one TpComm (3 of the
// team's mailboxes, not 3 each: 100 layers with a TpComm each would need 300 of the
// 255); the first, the last and a block of another comm group give the reference.
TEST(TeamMlpBlock, AModelsLayersShareTheLaunchFormsComm) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  constexpr int kTp = 2, kM = 3, kLayers = 100;
  LocalTeam team(kTp);
  ShardedBlock block(kTp, kM, true, true, rng);
  const std::vector<TeamMlpBlock::Weights> weights = block.weights();
  const std::vector<TeamMlpBlock::Buffers> buffers = block.buffers();
  std::vector<std::unique_ptr<TeamMlpBlock>> layers;
  for (int l = 0; l < kLayers; ++l)
    layers.push_back(std::make_unique<TeamMlpBlock>(team, weights, buffers, kM, TeamMlpBlock::Form::kLaunches));
  const TeamMlpBlock other_group(team, weights, buffers, kM, TeamMlpBlock::Form::kLaunches, 1);
  EXPECT_THROW(TeamMlpBlock(team, weights, buffers, kM, TeamMlpBlock::Form::kLaunches, -1), InvalidArgument);
  EXPECT_THROW(TeamMlpBlock(team, weights, buffers, kM, TeamMlpBlock::Form::kProgram, 1), InvalidArgument);
  EXPECT_EQ(TeamMlpBlock(team, weights, buffers, kM, std::nullopt, 2).form(), TeamMlpBlock::Form::kLaunches);
  const auto [outs, stream] = block.reference();
  for (const TeamMlpBlock* layer :
       std::vector<const TeamMlpBlock*>{layers.front().get(), layers.back().get(), &other_group}) {
    block.restart();
    layer->run();
    team.synchronize();
    for (int i = 0; i < kTp; ++i)
      EXPECT_LT(relative_error(block.out(i), outs[static_cast<std::size_t>(i)]), 1e-2) << "rank " << i;
  }
}

// The launch form refuses at build what its norms (the team's ar_norm) would refuse
// at every run after the first GEMMs were queued: H 4104, a multiple of 8 but not of 64.
TEST(TeamMlpBlock, TheLaunchFormRefusesAtBuildWhatItsNormsDoNotTake) {
  TPD_REQUIRE_GPU();
  constexpr int kTp = 2, kM = 2;
  LocalTeam team(kTp);
  const BareBlocks blocks(kTp, 4104, 64, kM);
  try {
    TeamMlpBlock block(team, blocks.w, blocks.b, kM, TeamMlpBlock::Form::kLaunches);
    ADD_FAILURE() << "built";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("driven rank 0"), std::string::npos) << e.what();
  }
}

// A norm's share above what a rank's CTAs hold (8 ranks on one GPU, 16 CTAs each;
// H 7168 at 16 rows: 56 pieces x 16 rows a CTA, 512 served): the program is
// Unavailable; at 9 rows it is served.
TEST(TeamMlpBlock, ANormShareAboveTheCtasIsUnavailable) {
  TPD_REQUIRE_GPU();
  int sms = 0;
  TPD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int share = (7168 / 8 + sms / 8 - 1) / (sms / 8);  // pieces of a row a CTA holds
  if (share * 16 <= 512 || share * 9 > 512) GTEST_SKIP() << "a GPU of " << sms << " SMs: another limit";
  constexpr int kTp = 8;
  LocalTeam team(kTp);
  auto build = [&](int m, std::optional<TeamMlpBlock::Form> form) {
    const BareBlocks blocks(kTp, 7168, 64, m);
    return TeamMlpBlock(team, blocks.w, blocks.b, m, form).form();
  };
  EXPECT_THROW(build(16, TeamMlpBlock::Form::kProgram), Unavailable);
  EXPECT_EQ(build(9, TeamMlpBlock::Form::kProgram), TeamMlpBlock::Form::kProgram);
}

}  // namespace
}  // namespace tpdecode
