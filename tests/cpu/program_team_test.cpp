// The team all-reduce of a TeamProgram's norm ops (src/program/program_team.hpp)
// under host threads: every rank's CTAs run a program's two all-reduce ops per run
// (each CTA its norm share of the columns, as the kernel's finisher does), with
// torn pushes, random delays and slow re-arms; checked: every sum is the rank-order
// sum of that run's data (nothing stale or foreign), no push lands on unread data,
// one epoch per run, every slot re-armed; an absent rank makes every other rank
// record the failure and finish its runs with NaN, and nothing hangs.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "cpu/protocol_harness.hpp"
#include "program/program_protocol.hpp"
#include "program/program_team.hpp"

namespace tpdecode {
namespace {

using namespace std::chrono_literals;
using test::Counts;
using test::HostTeam;

// Two all-reduce ops of 56 and 24 columns at their windows of the mailbox rows, on
// `ctas` CTAs per rank and `rows` tokens.
constexpr int64_t kWidths[] = {56, 24};
constexpr int kFrags = (56 + 24) / 8;

// One CTA's run: for each op its share's pushes, then its sums, checked against
// round u's data; then its arrival. `rank_late`: the rank's CTAs sleep this long
// before the run (a slow rank).
template <int kRanks>
void cta_run(HostTeam& team, int box_index, int rank, int cta, int ctas, int rows, int u, test::CheckedMemory& mem,
             std::mt19937& rng, Counts& n) {
  const lamport::TeamRef ref = team.team_ref(rank);
  const lamport::MailboxRef box = team.box_ref(box_index);
  int64_t first = 0;
  for (const int64_t width : kWidths) {
    const program::protocol::Range share = program::protocol::norm_share(width, cta, ctas);
    const uint32_t parity = program::team::run_parity(mem, ref, box);
    if (parity == lamport::kAbortedEntry) {
      n.aborted.fetch_add(1);
      first += width / 8;
      continue;
    }
    for (int t = 0; t < rows; ++t)
      for (int64_t piece = share.begin; piece < share.end; ++piece) {
        if (rng() % 16 == 0) std::this_thread::yield();
        const int frag = static_cast<int>(first + piece);
        program::team::push_piece<kRanks>(mem, ref, box, parity, t, frag, test::round_data(u, rank, t, frag));
      }
    for (int t = 0; t < rows; ++t)
      for (int64_t piece = share.begin; piece < share.end; ++piece) {
        const int frag = static_cast<int>(first + piece);
        const lamport::Fragment got = program::team::reduce_piece<kRanks>(mem, ref, box, parity, t, frag);
        if (test::same(got, lamport::poisoned())) n.failed.fetch_add(1);
        else if (!test::same(got, test::expected_sum(kRanks, u, t, frag))) n.wrong.fetch_add(1);
      }
    first += width / 8;
  }
  program::team::end_run(mem, ref, box, static_cast<unsigned>(ctas));
}

template <int kRanks>
void clean_runs(int ctas, int rows, int rounds) {
  HostTeam team(kRanks, test::protocol_timeout(20s));
  const int box = team.add_mailbox(2, kRanks, rows, kFrags);
  Counts n;
  test::run_cta_rounds(team, ctas, rounds, 7u, n, [&](int rank, int cta, int u, auto& mem, std::mt19937& rng) {
    if (u % 7 == 3 && rng() % 4 == 0) mem.slow_rearms(200us, 2);  // a slow reader: a peer runs ahead
    cta_run<kRanks>(team, box, rank, cta, ctas, rows, u, mem, rng, n);
  });
  test::expect_clean(team, n, rounds, box);
}

TEST(ProgramTeam, TwoRanksThreeCtas) { clean_runs<2>(3, 2, test::protocol_rounds(300)); }
TEST(ProgramTeam, FourRanksTwoCtas) { clean_runs<4>(2, 3, test::protocol_rounds(200)); }
TEST(ProgramTeam, EightRanksOneCta) { clean_runs<8>(1, 1, test::protocol_rounds(100)); }

// Runs from an epoch just before the counter wraps: parities go on in turn.
TEST(ProgramTeam, AcrossTheEpochWrap) {
  HostTeam team(2, test::protocol_timeout(20s));
  const int box = team.add_mailbox(2, 2, 1, kFrags);
  team.set_epoch(box, 0xffffffffu - 5);
  Counts n;
  test::run_cta_rounds(team, 2, 12, 3u, n, [&](int rank, int cta, int u, auto& mem, std::mt19937& rng) {
    cta_run<2>(team, box, rank, cta, 2, 1, u, mem, rng, n);
  });
  test::expect_clean_at(team, n, box, 12u - 6u);
}

// Rank 3 of 4 never runs: every other rank's runs end (no hang) with NaN sums, the
// first failure a timeout naming slot 3, and every rank's record says what happened.
TEST(ProgramTeam, AbsentRankTimesOutAndAborts) {
  constexpr int kRanks = 4, kCtas = 2, kRows = 2;
  HostTeam team(kRanks, 200ms);
  const int box = team.add_mailbox(2, kRanks, kRows, kFrags);
  Counts n;
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (int rank = 0; rank < kRanks - 1; ++rank)
    for (int cta = 0; cta < kCtas; ++cta)
      threads.emplace_back([&, rank, cta] {
        std::mt19937 rng(static_cast<unsigned>(rank * 31 + cta));
        for (int u = 0; u < 3; ++u) {
          test::CheckedMemory mem(team.timeout(), &n.overwrites, &rng);
          cta_run<kRanks>(team, box, rank, cta, kCtas, kRows, u, mem, rng, n);
        }
      });
  for (auto& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0) << "the present ranks took too long to give up";
  EXPECT_EQ(n.wrong, 0) << "a sum was neither right nor NaN";
  EXPECT_GT(n.failed, 0) << "no sum was poisoned";
  EXPECT_GT(n.aborted, 0) << "no later op saw the abort";
  bool timeout_names_rank3 = false;
  for (int r = 0; r < kRanks - 1; ++r) {
    const lamport::ErrorRecord& e = team.error(r);
    ASSERT_EQ(e.flag, 1u) << "rank " << r << " recorded nothing";
    EXPECT_EQ(e.op, static_cast<int32_t>(lamport::Op::kProgram));
    if (e.kind == static_cast<int32_t>(lamport::ErrorKind::kTimeout)) timeout_names_rank3 |= e.slot == kRanks - 1;
    else EXPECT_EQ(e.kind, static_cast<int32_t>(lamport::ErrorKind::kAborted));
  }
  EXPECT_TRUE(timeout_names_rank3) << "no timeout named the absent rank's slot";
  for (int r = 0; r < kRanks; ++r) EXPECT_NE(team.control(r).abort, 0u) << "rank " << r << "'s abort word";
}

}  // namespace
}  // namespace tpdecode
