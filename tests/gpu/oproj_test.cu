// PreparedOproj on every team this machine has (local teams of 2, 4, 8 on one GPU;
// the NCCL team when there are 2 GPUs or more): every kind forced in turn, the
// mailbox kinds (producer + consumer, fused, two-shot) bitwise equal to each other and, given
// the same partials, to the CPU reference (the new residual or p' bitwise, the
// normalised rows within 1 BF16 ulp); every rank identical; every kind within a
// stated tolerance of the FP64 reference; AttnRes with 0, 1, 5 and 12 saved blocks
// and both block flags; bind_ahead merged vs direct; the drafter's shapes; graph
// replay with fresh data; 10,000 back-to-back calls of two layers sharing the
// mailbox; an absent rank -> TimeoutError -> reset() -> correct; the fused kind
// refused where its grid cannot be resident.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "gemm/gemm_tactic.hpp"
#include "gpu/comm_cases.hpp"
#include "gpu/gpu_test_util.hpp"
#include "gpu/oproj_cases.hpp"
#include "reference/attn_res.hpp"
#include "tpdecode/comm.hpp"
#include "tpdecode/local_team.hpp"
#include "tpdecode/nccl_team.hpp"
#include "tpdecode/oproj.hpp"

namespace tpdecode {
namespace {

using test::OprojCase;
using test::OprojOutputs;
using test::OprojShapeArgs;

// Against the FP64 reference: relative Frobenius error. Why this bound: each rank's
// partial is rounded once to BF16 from FP32 (GPU) or FP64 (CPU) sums, which moves
// single roundings by 1 ulp (2^-8 relative); everything after is the same math.
constexpr double kFp64Tolerance = 1e-2;
// bind_ahead's statistics and merged mixtures (FP32 outputs): exp is the only
// operation that differs from the reference (CUDA's expf within 2 ulp).
constexpr double kFp32Tolerance = 1e-5;
// The outputs' magnitude: RMS-normalised rows times a norm weight near one (ArNorm:
// up to 0.5), so one BF16 ulp at a quarter of it is far below any real error.
constexpr float kOutScale = 0.25f;

constexpr OprojKind kKinds[] = {OprojKind::kProducerConsumer, OprojKind::kFused, OprojKind::kTwoShot,
                                OprojKind::kUnfused};

struct KindRun {
  OprojResult result;
  std::vector<OprojOutputs> ranks;
};

KindRun run_kind(Team& team, PreparedOproj& op, OprojCase& c, OprojKind kind) {
  op.set_kind(kind);
  KindRun k;
  k.result = c.run(op);
  team.synchronize();
  for (int i = 0; i < team.driven(); ++i) k.ranks.push_back(c.outputs(i));
  return k;
}

std::shared_ptr<OprojMailbox> mailbox(Team& team, int64_t hidden) {
  return std::make_shared<OprojMailbox>(team, 64, hidden);
}

TpComm make_comm(Team& team, int64_t hidden) {
  CommConfig cc;
  cc.hidden = hidden;
  return TpComm(team, cc);
}

// Runs every kind on `c` and checks what the file's header promises; returns the
// kinds that ran.
std::vector<OprojKind> check_every_kind(Team& team, PreparedOproj& op, OprojCase& c) {
  const OprojShapeArgs& s = c.shape();
  const OprojOutputs fp64 = c.fp64_reference();
  const OprojOutputs same = c.gpu_partials_reference(op.producer_split(s.m));  // from the producer's own partials
  std::optional<OprojOutputs> mailbox_bits;
  std::vector<OprojKind> ran;
  for (OprojKind kind : kKinds) {
    SCOPED_TRACE(oproj_kind_name(kind));
    const KindRun k = run_kind(team, op, c, kind);
    if (k.result.kind != kind) {
      EXPECT_EQ(k.result.kind, OprojKind::kUnfused);
      EXPECT_FALSE(k.result.why.empty());
      continue;  // refused (with why): the unfused path ran; checked in its own turn
    }
    ran.push_back(kind);
    for (int i = 1; i < team.driven(); ++i) EXPECT_EQ(k.ranks[static_cast<std::size_t>(i)], k.ranks[0]) << "driven rank " << i;
    const OprojOutputs& got = k.ranks[0];
    EXPECT_LT(test::relative_error(got.first, fp64.first), kFp64Tolerance);
    EXPECT_LT(test::relative_error(got.out, fp64.out), kFp64Tolerance);
    if (kind == OprojKind::kUnfused) continue;
    EXPECT_EQ(test::count_beyond(got.first, same.first, 0), 0) << "the new residual / p' is not bitwise";
    EXPECT_EQ(test::count_beyond(got.out, same.out, 1, kOutScale), 0);
    if (s.ahead) {
      EXPECT_LT(test::relative_error(got.stats, same.stats), kFp32Tolerance);
      EXPECT_LT(test::relative_error(got.mixture, same.mixture), kFp32Tolerance);
    }
    // Why two-shot too: its owners clean their sums, which changes a sum word only
    // where it is exactly (+0, -0), never for these random rows.
    if (mailbox_bits)
      EXPECT_TRUE(got == *mailbox_bits) << "the mailbox kinds differ";
    else
      mailbox_bits = got;
  }
  return ran;
}

bool ran(const std::vector<OprojKind>& kinds, OprojKind k) {
  return std::find(kinds.begin(), kinds.end(), k) != kinds.end();
}

TEST(Oproj, ArNormKindsAgreeBitwiseAndMatchTheReferenceOnEveryRank) {
  TPD_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  const std::vector<int> rows = test::quick() ? std::vector<int>{1, 5, 16} : std::vector<int>{1, 2, 3, 5, 8, 13, 16, 40, 64};
  test::for_each_team([&](Team& team) {
    TpComm comm = make_comm(team, 1024);
    auto box = mailbox(team, 1024);
    int fused_runs = 0;
    for (int m : rows) {
      SCOPED_TRACE(testing::Message() << "TP " << team.size() << " rows " << m);
      OprojCase c(team, {m, 1024, 256, OprojEpilogue::kArNorm}, seed + static_cast<uint64_t>(m));
      PreparedOproj op(comm, box, c.weights(), OprojEpilogue::kArNorm, {{m}});
      const std::vector<OprojKind> kinds = check_every_kind(team, op, c);
      if (m == 1) EXPECT_TRUE(ran(kinds, OprojKind::kProducerConsumer)) << "producer + consumer serves 1 row";
      EXPECT_TRUE(ran(kinds, OprojKind::kTwoShot)) << "the two-shot serves every row count";
      fused_runs += ran(kinds, OprojKind::kFused);
    }
    // The fused grid (16 producer CTAs + 8 per row) fits a local team of 2 up to
    // about 10 rows and a GPU of its own up to 16; at local TP 4 and 8 only where the
    // occupancy query allows (measured, not assumed).
    if (team.kind() == TeamKind::kNccl || team.size() == 2) EXPECT_GT(fused_runs, 0) << "the fused kind never ran";
  });
}

TEST(Oproj, AttnResEveryBlockCountAndFlagAndBindAhead) {
  TPD_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  test::for_each_team([&](Team& team) {
    if (team.kind() == TeamKind::kLocal && team.size() != 4) return;  // one local size is enough here
    TpComm comm = make_comm(team, 1024);
    auto box = mailbox(team, 1024);
    const std::vector<int> rows = test::quick() ? std::vector<int>{1} : std::vector<int>{1, 3};
    const std::vector<int> blocks = test::quick() ? std::vector<int>{0, 12} : std::vector<int>{0, 1, 5, 12};
    for (int m : rows) {
      for (int nb : blocks) {
        for (bool new_block : {false, true}) {
          SCOPED_TRACE(testing::Message() << "rows " << m << " nb " << nb << (new_block ? " new block" : ""));
          const bool ahead = nb > 0;
          OprojCase c(team, {m, 1024, 256, OprojEpilogue::kAttnRes, nb, new_block, ahead},
                      seed + static_cast<uint64_t>(100 * m + 2 * nb + new_block));
          PreparedOproj op(comm, box, c.weights(), OprojEpilogue::kAttnRes, {{m}});
          const std::vector<OprojKind> kinds = check_every_kind(team, op, c);
          EXPECT_TRUE(ran(kinds, OprojKind::kProducerConsumer));
        }
      }
    }
  });
}

// The GPU's bind_ahead statistics merged with the next layer's own partial (CPU)
// against that layer's AttnRes computed directly over the same sources.
TEST(Oproj, BindAheadMergedIsTheDirectComputation) {
  TPD_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  LocalTeam team(2);
  TpComm comm = make_comm(team, 1024);
  auto box = mailbox(team, 1024);
  for (int nb : {1, 5, 12}) {
    SCOPED_TRACE(testing::Message() << "nb " << nb);
    const int m = 4;
    OprojCase c(team, {m, 1024, 256, OprojEpilogue::kAttnRes, nb, false, true}, seed + static_cast<uint64_t>(nb));
    PreparedOproj op(comm, box, c.weights(), OprojEpilogue::kAttnRes, {{m}, OprojKind::kProducerConsumer});
    EXPECT_EQ(c.run(op).kind, OprojKind::kProducerConsumer);
    team.synchronize();
    const OprojOutputs got = c.outputs(0);
    // The next layer: its own p' (a new block here) and its g', q'.
    std::mt19937_64 rng(seed + 77);
    const std::vector<uint16_t> next_partial = test::random_bf16(static_cast<std::size_t>(m * 1024), rng);
    const reference::AttnResWeights next = c.next_weights();
    const reference::AttnResStats stats{got.stats, got.mixture};
    const std::vector<float> merged =
        reference::attn_res_merge(stats, next_partial, next.key_norm, next.query, next.eps, 1024);
    const reference::AttnResRows direct = reference::attn_res(next_partial, {}, true, c.blocks(), nb, next, 1024);
    EXPECT_LT(test::relative_error(merged, direct.mixed), kFp32Tolerance);
  }
}

// A TpComm narrower than the o-projection and one GEMM context for two driven ranks
// (their GEMMs run at once) are refused at construction; a TpComm shorter than a
// call's rows where the call runs unfused (the kind that uses it), before anything
// is queued.
TEST(Oproj, ACommOrGemmContextThatDoesNotFitIsRefused) {
  TPD_REQUIRE_GPU();
  LocalTeam team(2);
  auto box = mailbox(team, 1024);
  OprojCase c(team, {1, 1024, 256, OprojEpilogue::kArNorm}, test::fresh_seed());
  TpComm narrow = make_comm(team, 512);
  EXPECT_THROW(PreparedOproj(narrow, box, c.weights(), OprojEpilogue::kArNorm), InvalidArgument);
  CommConfig short_rows;
  short_rows.hidden = 1024;
  short_rows.rows_cap = 8;  // the mailbox holds 64
  TpComm shorter(team, short_rows);
  {
    // The rule table is empty: 16 rows plan to run unfused, through a TpComm of 8.
    EXPECT_THROW(PreparedOproj(shorter, box, c.weights(), OprojEpilogue::kArNorm, {{16}}), CapacityError);
    PreparedOproj op8(shorter, box, c.weights(), OprojEpilogue::kArNorm, {{8}});
    op8.set_kind(OprojKind::kUnfused);
    OprojCase c16(team, {16, 1024, 256, OprojEpilogue::kArNorm}, test::fresh_seed());
    const std::vector<OprojOutputs> before = {c16.outputs(0), c16.outputs(1)};
    EXPECT_THROW(op8.run(c16.ar_norm_io(), test::team_streams(team)), CapacityError);
    team.synchronize();
    for (int i = 0; i < 2; ++i) EXPECT_EQ(c16.outputs(i), before[static_cast<std::size_t>(i)]) << "queued on " << i;
  }
  TpComm comm = make_comm(team, 1024);
  OprojOptions shared;
  auto context = std::make_shared<CublasContext>();
  shared.cublas = {context, context};
  EXPECT_THROW(PreparedOproj(comm, box, c.weights(), OprojEpilogue::kArNorm, shared), InvalidArgument);
  shared.cublas = {context, std::make_shared<CublasContext>()};
  EXPECT_NO_THROW(PreparedOproj(comm, box, c.weights(), OprojEpilogue::kArNorm, shared));
  // A row count not prepared, called on streams of the caller's that capture (the
  // team's do not): refused, not prepared mid-capture.
  PreparedOproj op(comm, box, c.weights(), OprojEpilogue::kArNorm);
  std::vector<cudaStream_t> mine(2);
  for (cudaStream_t& s : mine) TPD_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  TPD_CUDA(cudaStreamBeginCapture(mine[0], cudaStreamCaptureModeThreadLocal));
  EXPECT_THROW(op.run(c.ar_norm_io(), mine), InvalidArgument);
  cudaGraph_t graph;
  TPD_CUDA(cudaStreamEndCapture(mine[0], &graph));
  TPD_CUDA(cudaGraphDestroy(graph));
  EXPECT_FALSE(op.prepared(1));
  for (cudaStream_t s : mine) TPD_CUDA(cudaStreamDestroy(s));
}

// The drafter's o_proj (docs/drafter.md): H 7168, K = 96 heads x 128 / TP.
TEST(Oproj, DrafterShapes) {
  TPD_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  test::for_each_team([&](Team& team) {
    if (team.kind() == TeamKind::kLocal && team.size() != 8) return;
    const int64_t k = 96 * 128 / team.size();
    TpComm comm = make_comm(team, 7168);
    auto box = mailbox(team, 7168);
    for (int m : {1, 4, 8}) {
      SCOPED_TRACE(testing::Message() << "TP " << team.size() << " rows " << m);
      OprojCase c(team, {m, 7168, k, OprojEpilogue::kArNorm}, seed + static_cast<uint64_t>(m));
      PreparedOproj op(comm, box, c.weights(), OprojEpilogue::kArNorm, {{m}});
      const std::vector<OprojKind> kinds = check_every_kind(team, op, c);
      // Local TP 8: the consumers' grids of 8 ranks share one GPU (ArNorm's budget,
      // about 7-8 rows of 128-thread clusters).
      if (team.kind() == TeamKind::kNccl || m <= 4) EXPECT_TRUE(ran(kinds, OprojKind::kProducerConsumer));
      if (team.kind() == TeamKind::kLocal) {
        // 112 x split producer CTAs + 8 per row cannot be resident for 8 ranks on one GPU.
        op.set_kind(OprojKind::kFused);
        const OprojResult r = op.plan(m);
        EXPECT_EQ(r.kind, OprojKind::kUnfused);
        EXPECT_NE(r.why.find("can hold"), std::string::npos) << r.why;
      }
    }
  });
}

TEST(Oproj, GraphReplayWithFreshData) {
  TPD_REQUIRE_GPU();
  const int replays = test::quick() ? 50 : 1000;
  const uint64_t seed = test::fresh_seed();
  test::for_each_team([&](Team& team) {
    if (team.kind() == TeamKind::kLocal && team.size() != 8) return;
    const int m = 4;
    TpComm comm = make_comm(team, 1024);
    auto box = mailbox(team, 1024);
    OprojCase c(team, {m, 1024, 256, OprojEpilogue::kArNorm}, seed);
    PreparedOproj op(comm, box, c.weights(), OprojEpilogue::kArNorm, {{m}, OprojKind::kProducerConsumer});
    DeviceBuffer want = test::to_device(c.gpu_partials_reference(op.producer_split(m)).first);
    DeviceBuffer mismatches(sizeof(unsigned));
    TPD_CUDA(cudaMemset(mismatches.get(), 0, sizeof(unsigned)));
    const std::vector<cudaStream_t> streams = test::team_streams(team);
    EXPECT_EQ(c.run(op).kind, OprojKind::kProducerConsumer);  // eager warm-up
    team.synchronize();
    test::TeamGraph graph(team, [&] {
      c.run(op);
      for (int i = 0; i < team.driven(); ++i)
        test::count_mismatches(c.first_buffer(i).get(), want.get(), c.rows_elements(), mismatches.as<unsigned>(),
                               streams[static_cast<std::size_t>(i)]);
    });
    graph.replay(replays);
    team.synchronize();
    EXPECT_EQ(test::to_host<unsigned>(mismatches, 1)[0], 0u) << replays << " replays";
    c.refill_x(team, seed + 1);
    const OprojOutputs fresh = c.gpu_partials_reference(op.producer_split(m));
    test::upload(want, fresh.first.data(), fresh.first.size() * 2);
    graph.replay(3);
    team.synchronize();
    EXPECT_EQ(test::to_host<unsigned>(mismatches, 1)[0], 0u) << "fresh data";
    for (int i = 0; i < team.driven(); ++i) EXPECT_EQ(test::count_beyond(c.outputs(i).out, fresh.out, 1, kOutScale), 0);
  });
}

// Two layers (ArNorm, AttnRes) sharing the mailbox, called alternately: the
// device-side epoch alternates the parity by use; every call checked on the device.
TEST(Oproj, TenThousandBackToBackCallsOfTwoLayers) {
  TPD_REQUIRE_GPU();
  const int calls = test::quick() ? 300 : 10000;
  const uint64_t seed = test::fresh_seed();
  test::for_each_team([&](Team& team) {
    if (team.kind() == TeamKind::kLocal && team.size() != 4) return;
    const int m = 2;
    TpComm comm = make_comm(team, 1024);
    auto box = mailbox(team, 1024);
    OprojCase a(team, {m, 1024, 256, OprojEpilogue::kArNorm}, seed);
    OprojCase b(team, {m, 1024, 256, OprojEpilogue::kAttnRes, 2, false}, seed + 1);
    PreparedOproj la(comm, box, a.weights(), OprojEpilogue::kArNorm, {{m}, OprojKind::kFused});
    PreparedOproj lb(comm, box, b.weights(), OprojEpilogue::kAttnRes, {{m}, OprojKind::kProducerConsumer});
    EXPECT_EQ(la.plan(m).kind, OprojKind::kFused) << la.plan(m).why;
    const DeviceBuffer want_a = test::to_device(a.gpu_partials_reference(la.producer_split(m)).first);
    const DeviceBuffer want_b = test::to_device(b.gpu_partials_reference(lb.producer_split(m)).first);
    DeviceBuffer mismatches(sizeof(unsigned));
    TPD_CUDA(cudaMemset(mismatches.get(), 0, sizeof(unsigned)));
    const std::vector<cudaStream_t> streams = test::team_streams(team);
    for (int call = 0; call < calls; ++call) {
      OprojCase& c = call % 2 ? b : a;
      c.run(call % 2 ? lb : la);
      for (int i = 0; i < team.driven(); ++i)
        test::count_mismatches(c.first_buffer(i).get(), (call % 2 ? want_b : want_a).get(), c.rows_elements(),
                               mismatches.as<unsigned>(), streams[static_cast<std::size_t>(i)]);
    }
    team.synchronize();
    EXPECT_EQ(test::to_host<unsigned>(mismatches, 1)[0], 0u) << calls << " calls";
  });
}

TEST(Oproj, AbsentRankTimesOutThenResetRecovers) {
  TPD_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  TeamOptions options;
  options.timeout_ms = 200;
  const auto body = [&](Team& team) {
    const int m = 2;
    TpComm comm = make_comm(team, 1024);
    auto box = mailbox(team, 1024);
    for (OprojKind kind : {OprojKind::kProducerConsumer, OprojKind::kFused, OprojKind::kTwoShot}) {
      SCOPED_TRACE(oproj_kind_name(kind));
      OprojCase c(team, {m, 1024, 256, OprojEpilogue::kArNorm}, seed + static_cast<uint64_t>(kind));
      PreparedOproj op(comm, box, c.weights(), OprojEpilogue::kArNorm, {{m}, kind});
      ASSERT_EQ(op.plan(m).kind, kind) << op.plan(m).why;
      const OprojOutputs want = c.gpu_partials_reference(op.producer_split(m));
      for (int i = 0; i < team.driven(); ++i)
        if (team.rank(i) == team.size() - 1) test::spin(team.stream(i), 2.5 * 200);
      c.run(op);
      EXPECT_THROW(team.synchronize(), TimeoutError);
      for (int i = 0; i < team.driven(); ++i) {
        const OprojOutputs got = c.outputs(i);
        EXPECT_TRUE(got.first == want.first || test::all_nan(got.first))
            << "driven rank " << i << ": an output neither right nor poisoned";
      }
      EXPECT_THROW(c.run(op), TimeoutError);  // until reset()
      team.reset();
      for (int call = 0; call < 3; ++call) {
        EXPECT_EQ(c.run(op).kind, kind);
        team.synchronize();
        for (int i = 0; i < team.driven(); ++i) EXPECT_EQ(c.outputs(i).first, want.first) << "after reset";
      }
    }
  };
  {
    SCOPED_TRACE("local team TP 4");
    LocalTeam team(4, 0, options);
    body(team);
  }
  const std::vector<int> devices = test::nccl_team_devices();
  std::string why;
  if (devices.size() < 2 || !nccl_team_available(&why)) return;
  SCOPED_TRACE("NCCL team");
  NcclTeam::run_threads(devices, body, options);
}

}  // namespace
}  // namespace tpdecode
