// The drafter step on the GPU (reduced configuration: hidden 4096, 2 layers, 16
// heads, vocabulary 16384) at TP 1 and on local teams of 2 and 4: the specialised
// path against the stock path (same draft tokens except near ties), bitwise repeats
// (eager and graph replay), every rank identical, and the logits against the CPU
// reference (cpu_reference.hpp) within a stated tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <vector>

#include "core/bf16.hpp"
#include "drafter/cpu_reference.hpp"
#include "drafter/gpu_drafter.hpp"
#include "drafter/token_agreement.hpp"
#include "gpu/gpu_test_util.hpp"
#include "tpdecode/local_team.hpp"

namespace tpdecode::drafter {
namespace {

// GPU vs CPU logits: relative Frobenius error. Why this bound: both round to BF16 at
// the same points; only the GEMMs' summation order differs (FP32 on the GPU, FP64
// on the CPU), which moves single roundings by 1 ulp (2^-8 relative).
constexpr double kCpuTolerance = 2e-2;

int rows_under_test() { return test::quick() ? 7 : 28; }

// The CPU reference logits, computed once per row count.
const CpuReference& cpu_reference(int rows) {
  static std::map<int, std::unique_ptr<CpuReference>> cache;
  auto& r = cache[rows];
  if (!r) {
    r = std::make_unique<CpuReference>(DrafterConfig::reduced_gpu(), rows);
    r->run();
  }
  return *r;
}


std::vector<uint16_t> eager(GpuDrafter& d, DrafterPath path, int m) {
  d.enqueue_step(path, m);
  return d.logits(0, m);
}

std::vector<uint16_t> graph_replay(GpuDrafter& d, DrafterPath path, int m, int replays) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  // One step per graph (an odd number of all-reduces), replayed back to back.
  TPD_CUDA(cudaStreamBeginCapture(d.stream(), cudaStreamCaptureModeThreadLocal));
  d.enqueue_step(path, m);
  TPD_CUDA(cudaStreamEndCapture(d.stream(), &graph));
  TPD_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < replays; ++i) TPD_CUDA(cudaGraphLaunch(exec, d.stream()));
  std::vector<uint16_t> out = d.logits(0, m);
  TPD_CUDA(cudaGraphExecDestroy(exec));
  TPD_CUDA(cudaGraphDestroy(graph));
  return out;
}

class DrafterStepGpu : public ::testing::TestWithParam<int> {};

TEST_P(DrafterStepGpu, SpecialisedMatchesStockRepeatsAndReference) {
  TPD_REQUIRE_GPU();
  const int tp = GetParam();
  const int m = rows_under_test();
  const DrafterConfig c = DrafterConfig::reduced_gpu();
  TeamOptions options;
  options.pdl = tp == 1;  // ranks sharing a GPU: no PDL (apps/drafter/gpu_step_ops.cpp)
  LocalTeam team(tp, 0, options);
  GpuDrafter d(team, c, 64);
  d.prepare(m);

  const std::vector<uint16_t> stock = eager(d, DrafterPath::kStock, m);
  const std::vector<int32_t> stock_tokens = d.tokens(0, m);
  const std::vector<uint16_t> spec = eager(d, DrafterPath::kSpecialised, m);
  const std::vector<int32_t> spec_tokens = d.tokens(0, m);

  // Every rank holds the same gathered logits and tokens.
  for (int i = 1; i < team.driven(); ++i) {
    EXPECT_EQ(d.logits(i, m), spec) << "rank " << i;
    EXPECT_EQ(d.tokens(i, m), spec_tokens) << "rank " << i;
  }
  // Bitwise run to run: eagerly again, and from graph replays.
  EXPECT_EQ(eager(d, DrafterPath::kSpecialised, m), spec);
  EXPECT_EQ(graph_replay(d, DrafterPath::kSpecialised, m, test::quick() ? 2 : 20), spec);

  // Tokens: equal except near ties of the stock logits.
  const TokenAgreement agreement = compare_tokens(stock, stock_tokens, spec_tokens, c.vocab);
  const int disagree = agreement.disagreements, near_tie = agreement.near_ties;
  EXPECT_EQ(disagree, near_tie) << "token disagreements beyond a near tie";

  // Against the CPU reference.
  const CpuReference& ref = cpu_reference(m);
  const double spec_err = test::relative_error(spec, ref.buffer(Buf::kLogits));
  const double stock_err = test::relative_error(stock, ref.buffer(Buf::kLogits));
  int cpu_agree = 0;
  for (std::size_t r = 0; r < static_cast<std::size_t>(m); ++r) cpu_agree += spec_tokens[r] == ref.tokens()[r];
  EXPECT_LT(spec_err, kCpuTolerance);
  EXPECT_LT(stock_err, kCpuTolerance);
  std::cout << "[ drafter ] TP " << tp << ", M " << m << ": stock/specialised tokens disagree on " << disagree
            << " rows (" << near_tie << " near ties); relative logit error vs CPU: specialised " << spec_err
            << ", stock " << stock_err << "; tokens equal to the CPU's: " << cpu_agree << "/" << m
            << "; specialised collectives: " << d.comm_paths() << "\n";
}

// The program path at TP 1 (the step's GEMMs, norms, residual adds and SiLU-muls as
// GemmPrograms up to kProgramMaxRows rows, the specialised path's launches above):
// the stock path's tokens except near ties, bitwise repeats (eager and graph
// replay), the logits against the CPU reference, and above the threshold the
// specialised path's bits.
TEST(DrafterProgramPath, MatchesStockRepeatsAndReference) {
  TPD_REQUIRE_GPU();
  const DrafterConfig c = DrafterConfig::reduced_gpu();
  LocalTeam team(1, 0, TeamOptions{});
  GpuDrafter d(team, c, 64);
  ASSERT_TRUE(d.serves_programs());
  EXPECT_THROW(d.enqueue_step(DrafterPath::kProgram, 1), InvalidArgument) << "before prepare";
  // One row too: the finisher's threads that do not sum run ahead of those that do.
  // Both sides of the threshold: the largest programs and the first launches.
  for (int m : {1, rows_under_test(), GpuDrafter::kProgramMaxRows, GpuDrafter::kProgramMaxRows + 1}) {
    SCOPED_TRACE(testing::Message() << "M " << m);
    const bool launches = m > GpuDrafter::kProgramMaxRows;
    EXPECT_EQ(GpuDrafter::program_form(m), launches ? ProgramForm::kLaunches : ProgramForm::kPrograms);
    d.prepare(m);
    const std::vector<uint16_t> stock = eager(d, DrafterPath::kStock, m);
    const std::vector<int32_t> stock_tokens = d.tokens(0, m);
    const std::vector<uint16_t> prog = eager(d, DrafterPath::kProgram, m);
    const std::vector<int32_t> prog_tokens = d.tokens(0, m);
    if (launches) EXPECT_EQ(eager(d, DrafterPath::kSpecialised, m), prog) << "the launches: the specialised bits";
    EXPECT_EQ(eager(d, DrafterPath::kProgram, m), prog);
    EXPECT_EQ(graph_replay(d, DrafterPath::kProgram, m, test::quick() ? 2 : 20), prog);
    EXPECT_THROW(d.enqueue_step(DrafterPath::kProgram, m, OpFilter::only(OpKind::kGemm)), InvalidArgument);
    const TokenAgreement agreement = compare_tokens(stock, stock_tokens, prog_tokens, c.vocab);
    const int disagree = agreement.disagreements, near_tie = agreement.near_ties;
    EXPECT_EQ(disagree, near_tie) << "token disagreements beyond a near tie";
    const double err = test::relative_error(prog, cpu_reference(m).buffer(Buf::kLogits));
    EXPECT_LT(err, kCpuTolerance);
    std::cout << "[ drafter ] program path (" << form_name(GpuDrafter::program_form(m)) << "), TP 1, M " << m
              << ": stock/program tokens disagree on " << disagree
              << " rows (" << near_tie << " near ties); relative logit error vs CPU " << err << "\n";
  }

}

// The program path on local teams of 2 and 8 (TeamPrograms: each rank's program on
// its share of the SMs, the all-reduce + norms inside them): the stock path's tokens
// except near ties, the logits against the CPU reference, every rank identical,
// bitwise repeats (eager and graph replay).
TEST(DrafterProgramPath, LocalTeamsAllReduceInsideThePrograms) {
  TPD_REQUIRE_GPU();
  const DrafterConfig c = DrafterConfig::reduced_gpu();
  for (int tp : {2, 8}) {
    TeamOptions options;
    options.pdl = false;  // ranks sharing a GPU (apps/drafter/gpu_step_ops.cpp)
    LocalTeam team(tp, 0, options);
    GpuDrafter d(team, c, 64);
    ASSERT_TRUE(d.serves_programs());
    for (int m : {1, std::min(rows_under_test(), GpuDrafter::kProgramMaxRows)}) {
      SCOPED_TRACE(testing::Message() << "local TP " << tp << ", M " << m);
      d.prepare(m);
      const std::vector<uint16_t> stock = eager(d, DrafterPath::kStock, m);
      const std::vector<int32_t> stock_tokens = d.tokens(0, m);
      const std::vector<uint16_t> prog = eager(d, DrafterPath::kProgram, m);
      const std::vector<int32_t> prog_tokens = d.tokens(0, m);
      for (int i = 1; i < team.driven(); ++i) EXPECT_EQ(d.logits(i, m), prog) << "rank " << i;
      EXPECT_EQ(eager(d, DrafterPath::kProgram, m), prog);
      EXPECT_EQ(graph_replay(d, DrafterPath::kProgram, m, test::quick() ? 2 : 20), prog);
      const TokenAgreement agreement = compare_tokens(stock, stock_tokens, prog_tokens, c.vocab);
      EXPECT_EQ(agreement.disagreements, agreement.near_ties) << "token disagreements beyond a near tie";
      const double err = test::relative_error(prog, cpu_reference(m).buffer(Buf::kLogits));
      EXPECT_LT(err, kCpuTolerance);
      std::cout << "[ drafter ] program path, local TP " << tp << ", M " << m << ": stock/program tokens disagree on "
                << agreement.disagreements << " rows (" << agreement.near_ties
                << " near ties); relative logit error vs CPU " << err << "\n";
    }
  }
}

// The specialised path with every layer's o_proj + all-reduce + post-attention
// norm as one PreparedOproj call (producer + consumer forced): against the CPU
// reference, every rank identical, bitwise run to run (eager and graph replay).
TEST(DrafterStepGpuOproj, ProducerConsumerMatchesTheReferenceAndRepeats) {
  TPD_REQUIRE_GPU();
  const int m = rows_under_test();
  const DrafterConfig c = DrafterConfig::reduced_gpu();
  for (int tp : {2, 4}) {
    SCOPED_TRACE(testing::Message() << "local TP " << tp);
    TeamOptions options;
    options.pdl = false;  // ranks sharing a GPU (apps/drafter/gpu_step_ops.cpp)
    LocalTeam team(tp, 0, options);
    GpuDrafter d(team, c, 64);
    d.set_oproj_kind(OprojKind::kProducerConsumer);
    d.prepare(m);
    const std::vector<uint16_t> spec = eager(d, DrafterPath::kSpecialised, m);
    // Served (every layer fused) or declined with the reason (the ranks sharing this
    // GPU cannot hold the consumer grids of m rows at once).
    const std::string paths = d.comm_paths();
    const bool fused = paths.find("oproj producer-consumer " + std::to_string(c.layers)) != std::string::npos;
    const bool declined = paths.find("oproj unfused " + std::to_string(c.layers)) != std::string::npos &&
                          paths.find("consumer grids") != std::string::npos;
    EXPECT_TRUE(fused != declined) << paths;
    if (tp == 2) EXPECT_TRUE(fused) << paths;
    for (int i = 1; i < team.driven(); ++i) EXPECT_EQ(d.logits(i, m), spec) << "rank " << i;
    EXPECT_EQ(eager(d, DrafterPath::kSpecialised, m), spec);
    EXPECT_EQ(graph_replay(d, DrafterPath::kSpecialised, m, test::quick() ? 2 : 20), spec);
    EXPECT_LT(test::relative_error(spec, cpu_reference(m).buffer(Buf::kLogits)), kCpuTolerance);
  }
}

INSTANTIATE_TEST_SUITE_P(LocalTeam, DrafterStepGpu, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& p) { return "TP" + std::to_string(p.param); });

}  // namespace
}  // namespace tpdecode::drafter
