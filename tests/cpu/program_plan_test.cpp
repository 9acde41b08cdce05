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
}

TEST(ProgramBuffers, RacesAndForeignWindowsAreRefused) {
  auto refused = [](const std::vector<OpBuffers>& ops) { EXPECT_THROW(check_buffers(ops), InvalidArgument); };
  refused({{mat(0, 4, 64), mat(64, 4, 64), -1}});                                    // out over its own x
  refused({{mat(0, 4, 64), mat(1000, 4, 64), -1}, {mat(0, 4, 64), mat(1100, 4, 64), -1}});  // outs overlap
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
  const MailboxLayout l = mailbox_layout(ops, {-1, 0, 0, 2, -1}, 5);
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
  EXPECT_EQ(mailbox_layout(ops, {-1, -1, -1, -1, -1}, 5).epoch_elements, 0);
}

}  // namespace
}  // namespace tpdecode::program
