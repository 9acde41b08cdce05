// The GEMM program's work plan: every (op, block, K step) taken by exactly one
// unit; each CTA's share of an op within one step of equal; a CTA's units in op
// order; parts of a block numbered in K order, part 0 (which completes the block) last
// in its CTA's share of the op; disjoint scratch slots; refusals of shapes the
// kernel cannot take.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "program/program_plan.hpp"
#include "program/program_protocol.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::program {
namespace {

void check_plan(const std::vector<OpShape>& ops, int ctas, int m, int depth) {
  SCOPED_TRACE(testing::Message() << ops.size() << " ops, " << ctas << " CTAs, m " << m << ", depth " << depth);
  const Plan plan = plan_program(ops, ctas, m, depth);
  ASSERT_EQ(plan.cta_begin.size(), static_cast<std::size_t>(ctas + 1));
  ASSERT_EQ(plan.cta_begin.front(), 0);
  ASSERT_EQ(static_cast<std::size_t>(plan.cta_begin.back()), plan.units.size());
  ASSERT_EQ(plan.blocks.size(), ops.size());
  std::map<std::tuple<int, int, int>, int> taken;         // (op, block, step) -> times
  std::map<std::pair<int, int>, std::vector<Unit>> parts;  // (op, block) -> its units
  for (int c = 0; c < ctas; ++c) {
    std::vector<int64_t> steps_per_op(ops.size(), 0);
    int last_op = -1;
    for (int i = plan.cta_begin[c]; i < plan.cta_begin[c + 1]; ++i) {
      const Unit& u = plan.units[static_cast<std::size_t>(i)];
      ASSERT_GE(u.op, last_op) << "CTA " << c << "'s units out of op order";
      last_op = u.op;
      ASSERT_LT(u.step_begin, u.step_end);
      ASSERT_LE(u.step_end, steps_of(ops[static_cast<std::size_t>(u.op)], depth));
      ASSERT_LT(u.block, plan.blocks[static_cast<std::size_t>(u.op)]);
      for (int s = u.step_begin; s < u.step_end; ++s) ++taken[{u.op, u.block, s}];
      steps_per_op[static_cast<std::size_t>(u.op)] += u.step_end - u.step_begin;
      parts[{u.op, u.block}].push_back(u);
    }
    for (std::size_t o = 0; o < ops.size(); ++o) {
      const int64_t work = plan.blocks[o] * steps_of(ops[o], depth);
      EXPECT_LE(steps_per_op[o], work / ctas + 1) << "op " << o << " CTA " << c;
      EXPECT_GE(steps_per_op[o], work / ctas) << "op " << o << " CTA " << c;
    }
  }
  int64_t cells = 0;
  for (std::size_t o = 0; o < ops.size(); ++o) {
    EXPECT_EQ(plan.blocks[o], (ops[o].n + 63) / 64);
    cells += plan.blocks[o] * steps_of(ops[o], depth);
  }
  ASSERT_EQ(static_cast<int64_t>(taken.size()), cells) << "a K step of a block nobody takes";
  for (const auto& [cell, times] : taken) ASSERT_EQ(times, 1) << "a K step taken twice";
  std::vector<std::pair<int64_t, int64_t>> slots;  // scratch ranges
  for (auto& [block, units] : parts) {
    std::sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) { return a.part < b.part; });
    const int n = static_cast<int>(units.size());
    for (int p = 0; p < n; ++p) {
      const Unit& u = units[static_cast<std::size_t>(p)];
      EXPECT_EQ(u.part, p);
      EXPECT_EQ(u.parts, n);
      EXPECT_EQ(u.scratch, units[0].scratch);
      if (p > 0) EXPECT_EQ(u.step_begin, units[static_cast<std::size_t>(p - 1)].step_end) << "parts not in K order";
    }
    if (n > 1) slots.push_back({units[0].scratch, units[0].scratch + int64_t{n} * m * kBlockRows});
  }
  std::sort(slots.begin(), slots.end());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    EXPECT_LE(slots[i].second, plan.scratch_floats);
    if (i > 0) EXPECT_LE(slots[i - 1].second, slots[i].first) << "scratch slots overlap";
  }
  // Part 0 of a split block is the last unit of its CTA in that op: the parts it
  // waits for are other CTAs' first (or only) units of the op.
  for (int c = 0; c < ctas; ++c)
    for (int i = plan.cta_begin[c]; i < plan.cta_begin[c + 1]; ++i) {
      const Unit& u = plan.units[static_cast<std::size_t>(i)];
      const bool last_of_op = i + 1 == plan.cta_begin[c + 1] || plan.units[static_cast<std::size_t>(i + 1)].op != u.op;
      const bool first_of_op = i == plan.cta_begin[c] || plan.units[static_cast<std::size_t>(i - 1)].op != u.op;
      if (u.parts > 1 && u.part == 0) EXPECT_TRUE(last_of_op) << "CTA " << c << " unit " << i;
      if (u.parts > 1 && u.part > 0) EXPECT_TRUE(first_of_op || last_of_op) << "CTA " << c << " unit " << i;
    }
}

TEST(ProgramPlan, TheDrafterChainAtTp8) {
  const std::vector<OpShape> layer = {{2112, 7168}, {2304, 1536}, {7168, 1536}, {4608, 7168}, {7168, 2304}};
  for (int depth : {2, 4})
    for (int m : {1, 8, 28, 64}) check_plan(layer, 132, m, depth);
}

TEST(ProgramPlan, RandomChains) {
  std::mt19937_64 rng(20261201);
  for (int t = 0; t < 200; ++t) {
    std::vector<OpShape> ops(1 + rng() % 6);
    for (OpShape& op : ops) op = {static_cast<int64_t>(1 + rng() % 3000), static_cast<int64_t>(64 * (1 + rng() % 80))};
    const int ctas = static_cast<int>(1 + rng() % 140);
    check_plan(ops, ctas, static_cast<int>(1 + rng() % 64), rng() % 2 ? 4 : 2);
  }
}

TEST(ProgramPlan, SmallOpsLeaveCtasIdle) {
  const Plan plan = plan_program({{64, 64}}, 132, 4, 4);  // one block, one step
  ASSERT_EQ(plan.units.size(), 1u);
  EXPECT_EQ(plan.units[0].parts, 1);
  EXPECT_EQ(plan.scratch_floats, 0);
}

TEST(ProgramPlan, RefusesWhatTheKernelCannotRun) {
  EXPECT_THROW(plan_program({{64, 100}}, 8, 1, 4), InvalidArgument);  // K not a multiple of 64
  EXPECT_THROW(plan_program({{0, 64}}, 8, 1, 4), InvalidArgument);
  EXPECT_THROW(plan_program({{64, 64}}, 0, 1, 4), InvalidArgument);
}

}  // namespace
}  // namespace tpdecode::program

namespace tpdecode::program {
namespace {

// [rows, cols] bf16 at byte address `at` with `stride` elements per row.
Matrix mat(uintptr_t at, int64_t rows, int64_t cols, int64_t stride = 0) {
  return {at, rows, cols, stride == 0 ? cols : stride};
}

TEST(ProgramBuffers, WindowsOfEarlierOutsPass) {
  // x0 -> out0 = x1 -> out1 = x2 -> out2, 4 rows.
  const std::vector<OpBuffers> chain = {{mat(0, 4, 64), mat(1000, 4, 128), -1},
                                        {mat(1000, 4, 128), mat(3000, 4, 64), 0},
                                        {mat(3000, 4, 64), mat(5000, 4, 256), 1}};
  EXPECT_EQ(check_buffers(chain), (std::vector<int64_t>{0, 0, 0}));
  // Two readers of one out [4, 2112]: columns 0..1535 and 1536..2111 (row stride 2112).
  const std::vector<OpBuffers> split = {{mat(0, 4, 64), mat(1000, 4, 2112), -1},
                                        {mat(1000, 4, 1536, 2112), mat(50000, 4, 64), 0},
                                        {mat(1000 + 1536 * 2, 4, 576, 2112), mat(60000, 4, 64), 0}};
  EXPECT_EQ(check_buffers(split), (std::vector<int64_t>{0, 0, 1536}));
  // One row: any row stride of the window.
  EXPECT_NO_THROW(check_buffers({{mat(0, 1, 64), mat(1000, 1, 128), -1}, {mat(1016, 1, 64, 64), mat(3000, 1, 8), 0}}));
  // Independent ops on their own buffers; two ops reading one input.
  EXPECT_NO_THROW(check_buffers({{mat(0, 2, 64), mat(1000, 2, 64), -1}, {mat(0, 2, 64), mat(2000, 2, 64), -1}}));
  // Two ops writing disjoint column windows of one [4, 2048] buffer (bytes 10000 ..),
  // a third reading the first one's window; an input x in another column window of it.
  const std::vector<OpBuffers> fused = {{mat(0, 4, 64), mat(10000, 4, 1536, 2048), -1},
                                        {mat(0, 4, 64), mat(10000 + 1536 * 2, 4, 448, 2048), -1},
                                        {mat(10000, 4, 1536, 2048), mat(40000, 4, 64), 0},
                                        {mat(10000 + 1984 * 2, 4, 64, 2048), mat(50000, 4, 64), -1}};
  EXPECT_EQ(check_buffers(fused), (std::vector<int64_t>{0, 0, 0, 0}));
}

TEST(ProgramBuffers, RacesAndForeignWindowsAreRefused) {
  auto refused = [](const std::vector<OpBuffers>& ops) { EXPECT_THROW(check_buffers(ops), InvalidArgument); };
  refused({{mat(0, 4, 64), mat(64, 4, 64), -1}});                                    // out over its own x
  refused({{mat(0, 4, 64), mat(1000, 4, 64), -1}, {mat(0, 4, 64), mat(1100, 4, 64), -1}});  // outs overlap
  // Column windows of one [4, 2048] buffer that share a column (1535), and an out's
  // window over an input x's window of it.
  refused({{mat(0, 4, 64), mat(10000, 4, 1536, 2048), -1}, {mat(0, 4, 64), mat(10000 + 1535 * 2, 4, 64, 2048), -1}});
  refused({{mat(10000 + 1500 * 2, 4, 64, 2048), mat(10000, 4, 1536, 2048), -1}});
  // Op 1 writes op 0's input x (even where op 1 depends on op 0).
  refused({{mat(0, 4, 64), mat(1000, 4, 64), -1}, {mat(1000, 4, 64), mat(0, 4, 64), 0}});
  // Op 1 reads op 0's out as an input.
  refused({{mat(0, 4, 64), mat(1000, 4, 64), -1}, {mat(1000, 4, 64), mat(3000, 4, 64), -1}});
  // Windows that are not: past the out's columns, another row stride, not 16-byte
  // aligned, fewer rows, before the out, a later op.
  const OpBuffers op0 = {mat(0, 4, 64), mat(1000, 4, 128), -1};
  refused({op0, {mat(1000 + 128, 4, 128, 128), mat(9000, 4, 64), 0}});
  refused({op0, {mat(1000, 4, 64, 64), mat(9000, 4, 64), 0}});
  refused({op0, {mat(1008, 4, 64, 128), mat(9000, 4, 64), 0}});
  refused({op0, {mat(1000, 2, 64, 128), mat(9000, 2, 64), 0}});
  refused({op0, {mat(984, 4, 64, 128), mat(9000, 4, 64), 0}});
  refused({op0, {mat(1000, 4, 64, 128), mat(9000, 4, 64), 1}});
}

TEST(ProgramMailbox, RegionsPerReadOpAlignedAndDisjoint) {
  const std::vector<OpShape> ops = {{2112, 7168}, {1536, 1536}, {577, 576}, {64, 576}, {7168, 64}};
  // Ops 1 and 2 read op 0; op 3 reads op 2; op 4 reads nothing published.
  const MailboxLayout l = mailbox_layout(ops, {-1, 0, 0, 2, -1}, 5, 132);
  EXPECT_EQ(l.offset[1], -1);
  EXPECT_EQ(l.offset[3], -1);
  EXPECT_EQ(l.offset[4], -1);
  ASSERT_GE(l.offset[0], 0);
  ASSERT_GE(l.offset[2], 0);
  EXPECT_EQ(l.stride[0], 2112);
  EXPECT_EQ(l.stride[2], 584);  // 577 rounded up to 8
  for (int o : {0, 2}) EXPECT_EQ(l.offset[o] % 8, 0);
  const int64_t end0 = l.offset[0] + 5 * l.stride[0], end2 = l.offset[2] + 5 * l.stride[2];
  EXPECT_TRUE(end0 <= l.offset[2] || end2 <= l.offset[0]);
  EXPECT_EQ(l.epoch_elements, 5 * (2112 + 584));
  EXPECT_EQ(l.epoch_elements % 8, 0);
  EXPECT_EQ(mailbox_layout(ops, {-1, -1, -1, -1, -1}, 5, 132).epoch_elements, 0);
}

// Regions [first, second) of a mailbox epoch: 16-byte aligned, inside it, pairwise disjoint.
void expect_aligned_and_disjoint(const std::vector<std::pair<int64_t, int64_t>>& regions, int64_t epoch_elements) {
  for (std::size_t a = 0; a < regions.size(); ++a) {
    EXPECT_EQ(regions[a].first % 8, 0);
    EXPECT_LE(regions[a].second, epoch_elements);
    for (std::size_t b = a + 1; b < regions.size(); ++b)
      EXPECT_TRUE(regions[a].second <= regions[b].first || regions[b].second <= regions[a].first) << a << " " << b;
  }
}

// Norm ops: no GEMM units, every CTA counts once; a stats region of [m, CTAs rounded
// up to 4] floats per norm, 16-byte aligned and apart from the outs' regions.
TEST(ProgramNorms, PlanAndMailbox) {
  const std::vector<OpShape> ops = {{7168, 1536}, {7168, 7168, true}, {4608, 7168}, {2112, 2112, true}};
  const Plan plan = plan_program(ops, 132, 5, 4);
  EXPECT_EQ(plan.blocks[1], 132);
  EXPECT_EQ(plan.blocks[3], 132);
  for (const Unit& u : plan.units) EXPECT_TRUE(u.op == 0 || u.op == 2) << "a unit of norm op " << u.op;
  const MailboxLayout l = mailbox_layout(ops, {-1, 0, 1, -1}, 5, 130);
  EXPECT_EQ(l.stats_stride, 132);
  EXPECT_EQ(l.stats[0], -1);
  EXPECT_EQ(l.stats[2], -1);
  ASSERT_GE(l.stats[1], 0);
  ASSERT_GE(l.stats[3], 0);
  std::vector<std::pair<int64_t, int64_t>> regions = {{l.stats[1], l.stats[1] + 2 * 5 * 132},
                                                      {l.stats[3], l.stats[3] + 2 * 5 * 132}};
  for (int o : {0, 1}) regions.push_back({l.offset[o], l.offset[o] + 5 * l.stride[o]});
  expect_aligned_and_disjoint(regions, l.epoch_elements);
  // Served: rows x pieces per CTA <= 512 (7168 columns on 132 CTAs: 7 pieces).
  EXPECT_NO_THROW(plan_program({{7168, 7168, true}}, 132, 64, 4));
  EXPECT_THROW(plan_program({{16384, 16384, true}}, 132, 64, 4), Unavailable);  // 16 pieces x 64 rows a CTA
  EXPECT_NO_THROW(plan_program({{16384, 16384, true}}, 132, 32, 4));
  EXPECT_THROW(plan_program({{7168, 7168, true}}, 16, 16, 4), Unavailable);  // a local TP 8 rank's 16 CTAs: 56 x 16
  EXPECT_NO_THROW(plan_program({{7168, 7168, true}}, 16, 9, 4));
  EXPECT_THROW(plan_program({{7168, 7164, true}}, 132, 1, 4), InvalidArgument);  // not a multiple of 8
}

TEST(ProgramNorms, NormSharesCoverTheColumnsOnce) {
  for (int64_t k : {8, 512, 1536, 7168, 8200})
    for (int ctas : {1, 7, 132}) {
      int64_t next = 0;
      for (int c = 0; c < ctas; ++c) {
        const protocol::Range r = protocol::norm_share(k, c, ctas);
        EXPECT_EQ(r.begin, next);
        EXPECT_LE(r.end - r.begin, (k / 8 + ctas - 1) / ctas);
        next = r.end;
      }
      EXPECT_EQ(next, k / 8);
    }
}

TEST(ProgramBuffers, NormResidualsInPlaceAndChained) {
  // Norm 0: x input, residual R in place; norm 1 reads norm 0's residual_out (R) in
  // place again.
  const Matrix r = mat(100000, 4, 64);
  const OpBuffers n0{mat(0, 4, 64), mat(1000, 4, 64), -1, r, -1, r};
  const OpBuffers n1{mat(3000, 4, 64), mat(5000, 4, 64), -1, {}, 0, r};
  EXPECT_NO_THROW(check_buffers({n0, n1}));
  // A third link of the stream, in place: its residual_out is n0's too.
  const OpBuffers n2{mat(7000, 4, 64), mat(9000, 4, 64), -1, {}, 1, r};
  EXPECT_NO_THROW(check_buffers({n0, n1, n2}));
  auto refused = [](const std::vector<OpBuffers>& ops, int line) {
    EXPECT_THROW(check_buffers(ops), InvalidArgument) << "line " << line;
  };
  // The residual_out over another op's input residual; over its own x; a second
  // writer of R that does not read it; an out over an input residual.
  refused({n0, {mat(3000, 4, 64), mat(5000, 4, 64), -1, r, -1, mat(20000, 4, 64)}}, __LINE__);
  refused({{mat(10000, 4, 64), mat(1000, 4, 64), -1, r, -1, mat(10000, 4, 64)}}, __LINE__);
  refused({n0, {mat(3000, 4, 64), mat(5000, 4, 64), -1, {}, -1, r}}, __LINE__);
  refused({{mat(0, 4, 64), mat(1000, 4, 64), -1, mat(200000, 4, 64), -1, {}},
           {mat(3000, 4, 64), mat(200000, 4, 64), -1}}, __LINE__);
}

// Folded norms: no units, no count, no stats, nothing published of their own; the
// GEMM producing a folded norm's x has a row-stats region of [m, its blocks rounded
// up to 4] floats, 16-byte aligned and apart from the other regions.
TEST(ProgramNorms, FoldedNormsPlanAndMailbox) {
  std::vector<OpShape> ops = {{7168, 1536}, {7168, 7168, true, true}, {4608, 7168}, {2112, 2112, true}};
  ops[0].row_stats = true;
  const Plan plan = plan_program(ops, 132, 5, 4);
  EXPECT_EQ(plan.blocks[1], 0);
  EXPECT_EQ(plan.blocks[3], 132);
  for (const Unit& u : plan.units) EXPECT_TRUE(u.op == 0 || u.op == 2) << "a unit of norm op " << u.op;
  // Op 2 reads op 0's out (rewired past the folded norm); op 3 reads op 2's.
  const MailboxLayout l = mailbox_layout(ops, {-1, 0, 0, 2}, 5, 132);
  EXPECT_EQ(row_stats_stride(7168), 112);
  EXPECT_EQ(row_stats_stride(2112), 36);  // 33 blocks
  EXPECT_EQ(l.stats[1], -1) << "a folded norm keeps no stats";
  EXPECT_EQ(l.stats[2], -1);
  ASSERT_GE(l.stats[0], 0);
  ASSERT_GE(l.stats[3], 0);
  EXPECT_EQ(l.offset[1], -1) << "nothing reads a folded norm's own region";
  std::vector<std::pair<int64_t, int64_t>> regions = {{l.stats[0], l.stats[0] + 2 * 5 * 112},
                                                      {l.stats[3], l.stats[3] + 2 * 5 * 132}};
  for (int o : {0, 2}) regions.push_back({l.offset[o], l.offset[o] + 5 * l.stride[o]});
  expect_aligned_and_disjoint(regions, l.epoch_elements);
  // A folded norm's out is not written: it may lie over another op's out.
  OpBuffers folded{mat(1000, 4, 64), mat(5000, 4, 64), 0};
  folded.folded = true;
  EXPECT_NO_THROW(check_buffers({{mat(0, 4, 64), mat(1000, 4, 64), -1}, folded, {mat(5000, 4, 64), mat(5000, 4, 64), 1}}));
  folded.folded = false;
  EXPECT_THROW(check_buffers({{mat(0, 4, 64), mat(1000, 4, 64), -1}, folded, {mat(5000, 4, 64), mat(5000, 4, 64), 1}}),
               InvalidArgument);
}

}  // namespace
}  // namespace tpdecode::program
