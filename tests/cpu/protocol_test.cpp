// The mailbox protocol driven by CPU threads: the collectives' own bodies
// (collectives.hpp), their entry (epochs, the abort word) and the device's memory
// policy compiled for the host, with random delays and torn stores. These tests are
// what a mutation of the protocol must fail (scripts/mutants.sh, docs/protocol.md).
#include <gtest/gtest.h>

#include <thread>

#include "cpu/protocol_harness.hpp"

namespace tpdecode::test {
namespace {

using lamport::Call;
using lamport::Op;

constexpr int kRows = 2, kFrags = 3;

// One call of a one-shot all-reduce and a gather by CTA `cta` of `ctas` of `rank`
// in round u. Items (row, frag) are dealt to CTAs round-robin; each CTA pushes all
// its items before its first poll, as a kernel thread does.
template <int kRanks>
void one_round(HostTeam& team, int ar_box, int gather_box, int rank, int cta, int ctas, int u, CheckedMemory& mem,
               std::mt19937& rng, Counts& n) {
  const lamport::TeamRef t = team.team_ref(rank);
  const lamport::MailboxRef ar = team.box_ref(ar_box);
  const lamport::MailboxRef ga = team.box_ref(gather_box);
  // As the kernels: begin, push, take a ticket, collect, advance the epoch if last.
  uint32_t ar_epoch = 0, ga_epoch = 0;
  const uint32_t ar_entry = lamport::begin(mem, t, ar, Op::kAllReduce, &ar_epoch);
  const uint32_t ga_entry = lamport::begin(mem, t, ga, Op::kGather, &ga_epoch);
  if (ar_entry == lamport::kAbortedEntry || ga_entry == lamport::kAbortedEntry) {
    n.aborted.fetch_add(1);
    return;
  }
  const Call ar_call{Op::kAllReduce, static_cast<int>(ar_entry)};
  const Call ga_call{Op::kGather, static_cast<int>(ga_entry)};
  for (int i = cta; i < kRows * kFrags; i += ctas) {
    lamport::one_shot_push<kRanks>(mem, t, ar, ar_call, i / kFrags, i % kFrags, round_data(u, rank, i / kFrags, i % kFrags));
    lamport::gather_push<kRanks>(mem, t, ga, ga_call, i / kFrags, i % kFrags, kFrags,
                                 round_data(u + 1000, rank, i / kFrags, i % kFrags));
  }
  const uint32_t ar_ticket = lamport::take_ticket(mem, t, ar);
  const uint32_t ga_ticket = lamport::take_ticket(mem, t, ga);
  const auto advance = [&] {
    lamport::advance_if_last(mem, t, ar, ar_epoch, ar_ticket, static_cast<unsigned>(ctas));
    lamport::advance_if_last(mem, t, ga, ga_epoch, ga_ticket, static_cast<unsigned>(ctas));
  };
  if ((rng() & 15u) == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
  for (int i = cta; i < kRows * kFrags; i += ctas) {
    const int row = i / kFrags, frag = i % kFrags;
    Fragment sum;
    if (!lamport::one_shot_collect<kRanks>(mem, t, ar, ar_call, row, frag, &sum)) {
      n.failed.fetch_add(1);
      return;
    }
    if (!same(sum, expected_sum(kRanks, u, row, frag))) n.wrong.fetch_add(1);
  }
  for (int f = cta; f < kRows * kFrags * kRanks; f += ctas) {
    const int row = f / (kFrags * kRanks), col = f % (kFrags * kRanks);
    Fragment got;
    if (!lamport::gather_collect(mem, t, ga, ga_call, row, col, kFrags, &got)) {
      n.failed.fetch_add(1);
      return;
    }
    if (!same(got, lamport::clean(round_data(u + 1000, col / kFrags, row, col % kFrags)))) n.wrong.fetch_add(1);
  }
  advance();
}

template <int kRanks>
void run_rounds(HostTeam& team, int parities, int ctas, int rounds, Counts& n) {
  const int ar = team.add_mailbox(parities, kRanks, kRows, kFrags);
  const int ga = team.add_mailbox(parities, 1, kRows, kFrags * kRanks);
  run_cta_rounds(team, ctas, rounds, 17, n, [&](int rank, int cta, int u, CheckedMemory& mem, std::mt19937& rng) {
    one_round<kRanks>(team, ar, ga, rank, cta, ctas, u, mem, rng, n);
  });
}

template <int kRanks>
void expect_clean_rounds(int parities, int ctas, int rounds) {
  rounds = protocol_rounds(rounds);
  HostTeam team(kRanks, protocol_timeout(std::chrono::seconds(20)));
  Counts n;
  run_rounds<kRanks>(team, parities, ctas, rounds, n);
  expect_clean(team, n, rounds, 0);
}

TEST(Protocol, TwoRanksTwoParitiesTwoCtasTenThousandRounds) { expect_clean_rounds<2>(2, 2, 10000); }
TEST(Protocol, FourRanksThreeParitiesTenThousandRounds) { expect_clean_rounds<4>(3, 1, 10000); }
TEST(Protocol, EightRanksTwoParitiesTenThousandRounds) { expect_clean_rounds<8>(2, 1, 10000); }

// Epochs count modulo a multiple of the parities: at the 32-bit wrap the parities
// go on in turn (a plain counter would give parity 0 twice running with three).
TEST(Protocol, ParitiesGoOnInTurnAcrossTheEpochWrap) {
  for (int parities : {2, 3}) {
    const uint64_t period = (uint64_t{1} << 32) / static_cast<uint64_t>(parities) * static_cast<uint64_t>(parities);
    for (uint64_t e = period - 3 * static_cast<uint64_t>(parities); e < period; ++e) {
      const uint32_t next = lamport::next_epoch(static_cast<uint32_t>(e), parities);
      EXPECT_EQ(next % static_cast<uint32_t>(parities), (e + 1) % static_cast<uint64_t>(parities))
          << parities << " parities, epoch " << e;
      EXPECT_EQ(next, e + 1 == period ? 0u : static_cast<uint32_t>(e + 1));
    }
  }
  // Whole calls across the wrap: four ranks, three parities, from 20 calls before it.
  HostTeam team(4, protocol_timeout(std::chrono::seconds(20)));
  const uint32_t first = 4294967295u - 20;  // the period of three parities, 2^32 - 1, less 20
  team.set_epoch(0, first);  // run_rounds's mailboxes: 0 (the all-reduce) and 1 (the gather)
  team.set_epoch(1, first);
  Counts n;
  run_rounds<4>(team, 3, 2, 60, n);
  expect_clean_at(team, n, 0, 40);
}

TEST(Protocol, OneParityIsCaught) {
  // The checks have teeth: with one parity a fast rank pushes round u+1 into a slot
  // a slow rank has not read yet: an overwrite, wrong data or a timeout follows.
  HostTeam team(2, std::chrono::milliseconds(300));
  Counts n;
  run_rounds<2>(team, 1, 1, 300, n);
  EXPECT_GT(n.overwrites + n.wrong + n.failed, 0);
}

TEST(Protocol, SumIsInRankOrder) {
  // FP32 sums of {2^24, 1, -2^24, 1}: rank order gives 1, any other order 0 or 2.
  constexpr int kRanks = 4;
  const float planted[kRanks] = {16777216.0f, 1.0f, -16777216.0f, 1.0f};
  HostTeam team(kRanks, std::chrono::seconds(10));
  const int box = team.add_mailbox(2, kRanks, 1, 1);
  std::vector<Fragment> got(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank)
    threads.emplace_back([&, rank] {
      lamport::Memory mem(10'000'000'000ull);
      const lamport::TeamRef t = team.team_ref(rank);
      const lamport::MailboxRef b = team.box_ref(box);
      const Call call{Op::kAllReduce, static_cast<int>(lamport::enter(mem, t, b, Op::kAllReduce, 1))};
      const uint32_t w = bf16::pack(bf16::from_float(planted[rank]), bf16::from_float(-planted[rank]));
      lamport::one_shot_push<kRanks>(mem, t, b, call, 0, 0, Fragment{{w, w, w, w}});
      ASSERT_TRUE(lamport::one_shot_collect<kRanks>(mem, t, b, call, 0, 0, &got[static_cast<std::size_t>(rank)]));
    });
  for (auto& t : threads) t.join();
  const uint32_t one = bf16::pack(bf16::from_float(1.0f), bf16::from_float(-1.0f));
  for (int rank = 0; rank < kRanks; ++rank)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(got[static_cast<std::size_t>(rank)].w[j], one) << "rank " << rank;
}

TEST(Protocol, AbsentRankTimesOutNamingItsSlotAndAbortsTheTeam) {
  constexpr int kRanks = 4;
  HostTeam team(kRanks, std::chrono::milliseconds(100));
  const int box = team.add_mailbox(2, kRanks, 1, 1);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks - 1; ++rank)  // rank 3 never comes
    threads.emplace_back([&, rank] {
      lamport::Memory mem(100'000'000ull);
      const lamport::TeamRef t = team.team_ref(rank);
      const lamport::MailboxRef b = team.box_ref(box);
      const Call call{Op::kAllReduce, static_cast<int>(lamport::enter(mem, t, b, Op::kAllReduce, 1))};
      lamport::one_shot_push<kRanks>(mem, t, b, call, 0, 0, round_data(0, rank, 0, 0));
      Fragment sum;
      EXPECT_FALSE(lamport::one_shot_collect<kRanks>(mem, t, b, call, 0, 0, &sum));
    });
  for (auto& t : threads) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  int timed_out = 0;
  for (int rank = 0; rank < kRanks - 1; ++rank) {
    const lamport::ErrorRecord& e = team.error(rank);
    ASSERT_EQ(e.flag, 1u) << "rank " << rank;
    if (e.kind == static_cast<int32_t>(lamport::ErrorKind::kTimeout)) {
      ++timed_out;
      EXPECT_EQ(e.slot, kRanks - 1) << "the absent rank's slot";
      EXPECT_EQ(e.op, static_cast<int32_t>(Op::kAllReduce));
      EXPECT_EQ(e.parity, 0);
    } else {
      EXPECT_EQ(e.kind, static_cast<int32_t>(lamport::ErrorKind::kAborted));  // saw a peer's abort first
    }
  }
  EXPECT_GE(timed_out, 1);
  for (int rank = 0; rank < kRanks; ++rank) EXPECT_NE(team.control(rank).abort, 0u) << "rank " << rank << " not aborted";
  // The absent rank's next call does nothing: its entry finds the abort word.
  lamport::Memory mem(100'000'000ull);
  EXPECT_EQ(lamport::enter(mem, team.team_ref(kRanks - 1), team.box_ref(box), Op::kAllReduce, 1),
            lamport::kAbortedEntry);
  EXPECT_EQ(team.error(kRanks - 1).kind, static_cast<int32_t>(lamport::ErrorKind::kAborted));
}

TEST(Protocol, PollLeavesOnAPeersAbort) {
  HostTeam team(2, std::chrono::seconds(30));
  const int box = team.add_mailbox(2, 2, 1, 1);
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    lamport::Memory mem(1'000'000'000ull);
    const lamport::TeamRef t = team.team_ref(1);
    lamport::time_out(mem, t, Call{Op::kAllReduce, 0}, 0, 0, 0);
  });
  const auto start = std::chrono::steady_clock::now();
  lamport::Memory mem(30'000'000'000ull);
  const lamport::TeamRef t = team.team_ref(0);
  const lamport::MailboxRef b = team.box_ref(box);
  const Call call{Op::kAllReduce, static_cast<int>(lamport::enter(mem, t, b, Op::kAllReduce, 1))};
  Fragment sum;
  EXPECT_FALSE(lamport::one_shot_collect<2>(mem, t, b, call, 0, 0, &sum));
  aborter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "the poll ignored the abort word";
  EXPECT_EQ(team.error(0).kind, static_cast<int32_t>(lamport::ErrorKind::kAborted));
  EXPECT_EQ(team.error(0).slot, 1) << "names the rank that aborted";
}

// A late rank: rank 1 arrives late past the timeout once (in round 2 it waits until
// rank 0 has reported its timeout), then 5 ms slower every round. Without a
// team-wide abort, rank 0 timed out once and then read rank 1's late pushes as
// later rounds' data. Here every output is either correct or not produced
// (poisoned), and both ranks report.
TEST(Protocol, LateRankNeverYieldsStaleData) {
  constexpr int kRanks = 2, kRounds = 8, kRuns = 100;
  constexpr auto kTimeout = std::chrono::milliseconds(20);
  long stale = 0, runs_with_timeout = 0, runs_both_reported = 0;
  for (int run = 0; run < kRuns; ++run) {
    HostTeam team(kRanks, kTimeout);
    const int box = team.add_mailbox(2, kRanks, 1, 1);
    std::atomic<long> wrong{0};
    std::vector<std::thread> threads;
    for (int rank = 0; rank < kRanks; ++rank)
      threads.emplace_back([&, rank] {
        std::mt19937 rng(static_cast<unsigned>(run * 31 + rank));
        for (int u = 0; u < kRounds; ++u) {
          const bool late = rank == 1 && u >= 2;
          // Why wait for the report rather than sleep past the deadline: on a loaded
          // machine rank 0 itself may reach the round late, and a fixed sleep then
          // lands inside its deadline (1 run in 100 did on a 2-core CI machine).
          auto be_late = [&] {
            if (u > 2) return std::this_thread::sleep_for(std::chrono::milliseconds(5 * (u - 2)));
            const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
            while (!team.reported(0) && std::chrono::steady_clock::now() < give_up)
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
          };
          // Why both places: a late launch (before entry) and a slow kernel (after it).
          const bool before_entry = (rng() & 1u) != 0;
          if (late && before_entry) be_late();
          lamport::Memory mem(static_cast<uint64_t>(std::chrono::nanoseconds(kTimeout).count()));
          const lamport::TeamRef t = team.team_ref(rank);
          const lamport::MailboxRef b = team.box_ref(box);
          const uint32_t entry = lamport::enter(mem, t, b, Op::kAllReduce, 1);
          if (entry == lamport::kAbortedEntry) continue;  // output poisoned, reported
          if (late && !before_entry) be_late();
          const Call call{Op::kAllReduce, static_cast<int>(entry)};
          lamport::one_shot_push<kRanks>(mem, t, b, call, 0, 0, round_data(u, rank, 0, 0));
          Fragment sum;
          if (!lamport::one_shot_collect<kRanks>(mem, t, b, call, 0, 0, &sum)) continue;  // reported
          if (!same(sum, expected_sum(kRanks, u, 0, 0))) wrong.fetch_add(1);
        }
      });
    for (auto& t : threads) t.join();
    stale += wrong.load();
    runs_with_timeout += team.error(0).flag == 1 || team.error(1).flag == 1;
    runs_both_reported += team.error(0).flag == 1 && team.error(1).flag == 1;
  }
  EXPECT_EQ(stale, 0) << "outputs of later rounds held stale data";
  EXPECT_EQ(runs_with_timeout, kRuns) << "every run must see the late rank fail";
  EXPECT_EQ(runs_both_reported, kRuns) << "both ranks must report";
}

TEST(Protocol, TornFragmentIsNotPublished) {
  Fragment f = lamport::armed();
  EXPECT_FALSE(lamport::published(f));
  f.w[0] = 1;
  f.w[1] = 2;
  f.w[2] = 3;
  EXPECT_FALSE(lamport::published(f));  // the fourth word has not landed
  f.w[3] = 0;
  EXPECT_TRUE(lamport::published(f));
  EXPECT_EQ(lamport::clean(lamport::kSentinel), 0u);
  EXPECT_EQ(lamport::clean(0x80008000u), 0x80008000u);  // (-0, -0) is not the sentinel
}

TEST(Protocol, EpochAdvancesOncePerCallWhateverTheCtaCount) {
  HostTeam team(1, std::chrono::seconds(1));
  const int box = team.add_mailbox(3, 1, 1, 1);
  lamport::Memory mem(1'000'000'000ull);
  const lamport::TeamRef t = team.team_ref(0);
  const lamport::MailboxRef b = team.box_ref(box);
  for (int call = 0; call < 7; ++call)
    for (int cta = 0; cta < 5; ++cta)
      EXPECT_EQ(lamport::enter(mem, t, b, Op::kTest, 5), static_cast<uint32_t>(call % 3)) << "call " << call;
  EXPECT_EQ(team.control(0).mailbox[box].epoch, 7u);
}

// What the threads of the row entries saw: epochs other than their call's (the
// counter starts at 0 and advances once per call) and, per call, the parity the
// first thread saw (+1; 0: none yet) and how many threads saw another.
struct RowEntries {
  explicit RowEntries(int rounds) : parity(static_cast<std::size_t>(rounds)) {}
  std::vector<std::atomic<uint32_t>> parity;  // [call]
  std::atomic<long> other_epoch{0}, other_parity{0};
};

// `rounds` calls of one rank through ArNorm's per-thread entry (row_collective.cuh),
// `ctas` CTAs of `threads` threads: every thread begin()s (report false); thread 0
// takes its CTA's ticket after the CTA's barrier (the row sum's first
// __syncthreads), or before it (ticket_after_barrier false: the order that entry
// must not have), and advances the epoch at the end if its CTA was last. Random
// sleeps and yields before the entry (a late warp), before the barrier (pushes and
// polls) and after it (the epilogue). run_cta_rounds's "CTAs" are these threads:
// `threads` consecutive ones form a CTA.
void run_row_entries(HostTeam& team, int parities, int ctas, int threads, int rounds, bool ticket_after_barrier,
                     Counts& n, RowEntries& seen) {
  const int box = team.add_mailbox(parities, 1, 1, 1);
  std::vector<std::unique_ptr<std::barrier<>>> cta_barrier;
  for (int c = 0; c < ctas; ++c) cta_barrier.push_back(std::make_unique<std::barrier<>>(threads));
  run_cta_rounds(team, ctas * threads, rounds, 29, n, [&](int rank, int i, int u, CheckedMemory& mem, std::mt19937& rng) {
    const int cta = i / threads;
    const bool thread0 = i % threads == 0;
    const lamport::TeamRef t = team.team_ref(rank);
    const lamport::MailboxRef b = team.box_ref(box);
    const auto jitter = [&] {
      const unsigned r = rng() % 8;
      if (r == 0)
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
      else if (r < 4)
        std::this_thread::yield();
    };
    jitter();
    uint32_t epoch = 0;
    const uint32_t parity = lamport::begin(mem, t, b, Op::kArNorm, &epoch, /*report=*/false);
    if (epoch != static_cast<uint32_t>(u)) seen.other_epoch.fetch_add(1);
    uint32_t first = 0;
    if (!seen.parity[static_cast<std::size_t>(u)].compare_exchange_strong(first, parity + 1) && first != parity + 1)
      seen.other_parity.fetch_add(1);
    uint32_t ticket = 0;
    if (thread0 && !ticket_after_barrier) ticket = lamport::take_ticket(mem, t, b);
    jitter();
    cta_barrier[static_cast<std::size_t>(cta)]->arrive_and_wait();
    if (thread0 && ticket_after_barrier) ticket = lamport::take_ticket(mem, t, b);
    jitter();
    if (thread0) lamport::advance_if_last(mem, t, b, epoch, ticket, static_cast<unsigned>(ctas));
  });
}

void expect_row_entries_agree(int parities, int ctas, int threads, int rounds) {
  rounds = protocol_rounds(rounds);
  HostTeam team(1, std::chrono::seconds(1));
  Counts n;
  RowEntries seen(rounds);
  run_row_entries(team, parities, ctas, threads, rounds, true, n, seen);
  EXPECT_EQ(seen.other_epoch, 0) << "a thread read an epoch not its call's (the advanced one)";
  EXPECT_EQ(seen.other_parity, 0) << "threads of one call saw different parities";
  for (int u = 0; u < rounds; ++u)
    ASSERT_EQ(seen.parity[static_cast<std::size_t>(u)], static_cast<uint32_t>(u % parities) + 1) << "call " << u;
  expect_clean(team, n, rounds, 0);
}

TEST(Protocol, RowEntryEveryThreadOfTwoCtasSeesItsCallsParity) { expect_row_entries_agree(2, 2, 4, 3000); }
TEST(Protocol, RowEntryEveryThreadOfThreeCtasSeesItsCallsParityOfThree) { expect_row_entries_agree(3, 3, 3, 3000); }

TEST(Protocol, RowEntryTicketBeforeTheCtaBarrierIsCaught) {
  // The checks have teeth: a ticket taken before its CTA's barrier lets the last
  // CTA advance the epoch while a late thread of another CTA has not read it yet.
  HostTeam team(1, std::chrono::seconds(1));
  Counts n;
  RowEntries seen(1000);
  run_row_entries(team, 2, 2, 4, 1000, false, n, seen);
  EXPECT_GT(seen.other_epoch, 0);
}

}  // namespace
}  // namespace tpdecode::test
