// The two-shot protocol driven by CPU threads: the kernels' own bodies
// (collectives.hpp: two_shot_push, two_shot_reduce, two_shot_collect), their entry
// and the device's memory policy compiled for the host, with random delays, torn
// stores, slow owners and slow re-arms (a fast rank starts the next call while an
// owner still reduces or re-arms). A mutation of the protocol must fail these
// (scripts/mutants.sh, docs/protocol.md).
#include <gtest/gtest.h>

#include <thread>

#include "cpu/protocol_harness.hpp"

namespace tpdecode::test {
namespace {

using lamport::Call;
using lamport::Op;

constexpr int kRows = 2;
constexpr int kOwnerFrags = 2;  // fragments each owner owns per row

// The two halves' mailboxes on a host team: recv [parities, TP, kRows, kOwnerFrags]
// and gather [parities, 1, kRows, TP · kOwnerFrags], one epoch counter (recv's).
struct Boxes {
  int recv, gather;
};
Boxes add_boxes(HostTeam& team, int parities) {
  const int recv = team.add_mailbox(parities, team.size(), kRows, kOwnerFrags);
  return {recv, team.add_mailbox(parities, 1, kRows, kOwnerFrags * team.size(), recv)};
}

// Which phases a rank's call runs (an absent owner pushes but never reduces).
enum class Part { kAll, kPushOnly };

// One call of `cta` of `ctas` of `rank` in round u, as a kernel thread makes it:
// every push, then every owned reduction, then every gather poll; items dealt to
// CTAs round-robin. A slow owner sleeps before some reductions. Returns false once
// a poll failed (recorded; counted in n.failed).
template <int kRanks>
bool two_shot_call(HostTeam& team, Boxes b, int rank, int cta, int ctas, int u, CheckedMemory& mem,
                   std::mt19937& rng, Counts& n, bool slow_owner, Part part = Part::kAll) {
  const lamport::TeamRef t = team.team_ref(rank);
  const lamport::MailboxRef recv = team.box_ref(b.recv);
  const lamport::MailboxRef gather = team.box_ref(b.gather);
  const uint32_t entry = lamport::enter(mem, t, recv, Op::kTwoShotReduce, static_cast<unsigned>(ctas));
  if (entry == lamport::kAbortedEntry) {
    n.aborted.fetch_add(1);
    return false;
  }
  const Call reduce{Op::kTwoShotReduce, static_cast<int>(entry)};
  const Call collect{Op::kTwoShotGather, static_cast<int>(entry)};
  constexpr int kRowFrags = kOwnerFrags * kRanks;
  constexpr int kItems = kRows * kRowFrags;
  for (int i = cta; i < kItems; i += ctas)
    lamport::two_shot_push(mem, t, recv, reduce, i / kRowFrags, i % kRowFrags, kOwnerFrags,
                           round_data(u, rank, i / kRowFrags, i % kRowFrags));
  if (part == Part::kPushOnly) return true;
  for (int j = cta; j < kItems / kRanks; j += ctas) {
    if (slow_owner && (rng() & 3u) == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 100));
    if (!lamport::two_shot_reduce<kRanks>(mem, t, recv, gather, reduce, j / kOwnerFrags, j % kOwnerFrags,
                                          kOwnerFrags)) {
      n.failed.fetch_add(1);
      return false;
    }
  }
  lamport::two_shot_gather_phase(mem, t);
  for (int i = cta; i < kItems; i += ctas) {
    const int row = i / kRowFrags, frag = i % kRowFrags;
    Fragment got;
    if (!lamport::two_shot_collect(mem, t, gather, collect, row, frag, kOwnerFrags, &got)) {
      n.failed.fetch_add(1);
      return false;
    }
    if (!same(got, expected_sum(kRanks, u, row, frag))) n.wrong.fetch_add(1);
  }
  return true;
}

// 10,000 calls (TPDECODE_PROTOCOL_ROUNDS) on kRanks ranks of `ctas` CTAs each. Rank
// u % kRanks is a slow owner in round u; every re-arm sleeps 20 µs once in 64.
template <int kRanks>
void expect_clean_rounds(int parities, int ctas) {
  const int rounds = protocol_rounds(10000);
  HostTeam team(kRanks, protocol_timeout(std::chrono::seconds(20)));
  const Boxes b = add_boxes(team, parities);
  Counts n;
  run_cta_rounds(team, ctas, rounds, 5, n, [&](int rank, int cta, int u, CheckedMemory& mem, std::mt19937& rng) {
    mem.slow_rearms(std::chrono::microseconds(20), 64);
    two_shot_call<kRanks>(team, b, rank, cta, ctas, u, mem, rng, n, u % kRanks == rank);
  });
  expect_clean(team, n, rounds, b.recv);
  for (int r = 0; r < kRanks; ++r)
    EXPECT_EQ(team.control(r).mailbox[b.gather].epoch, 0u) << "the gather half has no epoch of its own";
}

TEST(TwoShotProtocol, TwoRanksTwoParitiesTwoCtas) { expect_clean_rounds<2>(2, 2); }
TEST(TwoShotProtocol, TwoRanksThreeParities) { expect_clean_rounds<2>(3, 1); }
TEST(TwoShotProtocol, FourRanksTwoParities) { expect_clean_rounds<4>(2, 1); }
TEST(TwoShotProtocol, FourRanksThreeParitiesTwoCtas) { expect_clean_rounds<4>(3, 2); }
TEST(TwoShotProtocol, EightRanksTwoParities) { expect_clean_rounds<8>(2, 1); }
TEST(TwoShotProtocol, EightRanksThreeParities) { expect_clean_rounds<8>(3, 1); }

// A fast rank against an owner whose every re-arm is slow (2 ms): with two parities
// the fast rank's next pushes go to the other parity; with one they land on slots
// the owner has not re-armed yet, and its late re-arm erases them. Returns the
// overwrites, wrong reads and failed or aborted calls.
template <int kParities>
long race_a_slow_owner() {
  constexpr int kRanks = 2;
  HostTeam team(kRanks, std::chrono::milliseconds(500));
  const Boxes b = add_boxes(team, kParities);
  Counts n;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank)
    threads.emplace_back([&, rank] {
      std::mt19937 rng(static_cast<unsigned>(rank + 1));
      for (int u = 0; u < 30; ++u) {
        CheckedMemory mem(team.timeout(), &n.overwrites, &rng);
        if (rank == 1) mem.slow_rearms(std::chrono::milliseconds(2), 1);
        if (!two_shot_call<kRanks>(team, b, rank, 0, 1, u, mem, rng, n, false)) return;
      }
    });
  for (auto& t : threads) t.join();
  return n.overwrites + n.wrong + n.failed + n.aborted;
}

TEST(TwoShotProtocol, FastRankRacesASlowOwner) { EXPECT_EQ(race_a_slow_owner<2>(), 0); }
TEST(TwoShotProtocol, OneParityIsCaught) { EXPECT_GT(race_a_slow_owner<1>(), 0); }

// One call of one row with one fragment per owner, rank r pushing word[r] in every
// word of its fragments: every rank's gathered row, [rank · kRanks + fragment].
template <int kRanks>
std::vector<Fragment> one_row_of(const uint32_t (&word)[kRanks]) {
  HostTeam team(kRanks, std::chrono::seconds(2));
  const int recv = team.add_mailbox(2, kRanks, 1, 1);
  const int gather = team.add_mailbox(2, 1, 1, kRanks, recv);
  std::vector<Fragment> got(kRanks * kRanks, lamport::armed());
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank)
    threads.emplace_back([&, rank] {
      lamport::Memory mem(2'000'000'000ull);
      const lamport::TeamRef t = team.team_ref(rank);
      const lamport::MailboxRef r = team.box_ref(recv), g = team.box_ref(gather);
      const Call call{Op::kTwoShotReduce, static_cast<int>(lamport::enter(mem, t, r, Op::kTwoShotReduce, 1))};
      const uint32_t w = word[rank];
      for (int frag = 0; frag < kRanks; ++frag)
        lamport::two_shot_push(mem, t, r, call, 0, frag, 1, Fragment{{w, w, w, w}});
      EXPECT_TRUE(lamport::two_shot_reduce<kRanks>(mem, t, r, g, call, 0, 0, 1));
      for (int frag = 0; frag < kRanks; ++frag)
        EXPECT_TRUE(lamport::two_shot_collect(mem, t, g, Call{Op::kTwoShotGather, call.parity}, 0, frag, 1,
                                              &got[static_cast<std::size_t>(rank * kRanks + frag)]));
    });
  for (auto& t : threads) t.join();
  EXPECT_TRUE(team.all_armed());
  return got;
}

// Every owned chunk of every rank has exactly one reducer, the thread holding that
// column of the rank's own share; no other thread reduces.
TEST(TwoShotProtocol, EachOwnedChunkHasOneReducerInItsOwnColumns) {
  for (int ranks : {2, 4, 8, 16}) {
    const int row_frags = 7168 / 8;
    const int owner_frags = row_frags / ranks;
    for (int rank = 0; rank < ranks; ++rank) {
      std::vector<int> reducers(owner_frags, 0);
      for (int frag = 0; frag < row_frags; ++frag) {
        const int chunk = lamport::two_shot_own_chunk(rank, frag, owner_frags);
        if (chunk < 0) continue;
        ASSERT_LT(chunk, owner_frags);
        EXPECT_EQ(frag / owner_frags, rank) << "a reducer outside the rank's own columns";
        ++reducers[chunk];
      }
      for (int c = 0; c < owner_frags; ++c) EXPECT_EQ(reducers[c], 1) << "TP " << ranks << " rank " << rank << " chunk " << c;
    }
  }
}

TEST(TwoShotProtocol, OwnersSumInRankOrder) {
  // FP32 sums of {2^24, 1, -2^24, 1}: rank order gives 1, any other order 0 or 2.
  const float planted[4] = {16777216.0f, 1.0f, -16777216.0f, 1.0f};
  uint32_t word[4];
  for (int r = 0; r < 4; ++r) word[r] = bf16::pack(bf16::from_float(planted[r]), bf16::from_float(-planted[r]));
  const uint32_t one = bf16::pack(bf16::from_float(1.0f), bf16::from_float(-1.0f));
  for (const Fragment& f : one_row_of<4>(word)) EXPECT_TRUE(same(f, Fragment{{one, one, one, one}}));
}

TEST(TwoShotProtocol, ASumEqualToTheSentinelArrivesAsZero) {
  // (1, -0) + (-1, -0) = (+0, -0): the sentinel word. The owner must clean its sum,
  // or the gather never sees it published.
  const uint32_t word[2] = {bf16::pack(bf16::from_float(1.0f), 0x8000), bf16::pack(bf16::from_float(-1.0f), 0x8000)};
  for (const Fragment& f : one_row_of<2>(word)) EXPECT_TRUE(same(f, Fragment{{0, 0, 0, 0}}));
}

// One call on a team of 4 ranks of 8 CTAs where rank 3 is absent, or pushes but
// never reduces: the other ranks' records and rank 3's next entry. With 8 CTAs and
// 4 owned chunks per rank, half of each rank's CTAs go straight to the gather.
struct Failed {
  std::vector<lamport::ErrorRecord> records;
  uint32_t late_entry;
  std::chrono::steady_clock::duration took;
};
Failed one_call_with_rank_3(bool pushes) {
  constexpr int kRanks = 4, kCtas = 8;
  HostTeam team(kRanks, std::chrono::milliseconds(100));
  const Boxes b = add_boxes(team, 2);
  Counts n;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  // Why the last CTAs first: their deadlines then start first, so only the gather
  // half's longer deadline keeps their gather polls from naming a waiting owner.
  for (int rank = 0; rank < (pushes ? kRanks : kRanks - 1); ++rank)
    for (int cta = kCtas - 1; cta >= 0; --cta)
      threads.emplace_back([&, rank, cta] {
        std::mt19937 rng(static_cast<unsigned>(rank));
        CheckedMemory mem(team.timeout(), nullptr, nullptr);
        two_shot_call<kRanks>(team, b, rank, cta, kCtas, 0, mem, rng, n, false,
                              rank == kRanks - 1 ? Part::kPushOnly : Part::kAll);
      });
  for (auto& t : threads) t.join();
  Failed f;
  f.took = std::chrono::steady_clock::now() - start;
  for (int rank = 0; rank < kRanks - 1; ++rank) f.records.push_back(team.error(rank));
  for (int rank = 0; rank < kRanks; ++rank) EXPECT_NE(team.control(rank).abort, 0u) << "rank " << rank;
  lamport::Memory mem(100'000'000ull);
  f.late_entry = lamport::enter(mem, team.team_ref(kRanks - 1), team.box_ref(b.recv), Op::kTwoShotReduce, 1);
  return f;
}

// Every record is complete; a timeout names the op, parity 0, slot 3 (the absent
// rank) and a column of owner `owner(rank)`; the other ranks saw the abort first.
// Rank 3's next call does nothing.
template <class OwnerOf>
void expect_named(const Failed& f, Op op, OwnerOf owner) {
  EXPECT_LT(f.took, std::chrono::seconds(2));
  int timed_out = 0;
  for (int rank = 0; rank < static_cast<int>(f.records.size()); ++rank) {
    const lamport::ErrorRecord& e = f.records[static_cast<std::size_t>(rank)];
    ASSERT_EQ(e.flag, 1u) << "rank " << rank;
    if (e.kind != static_cast<int32_t>(lamport::ErrorKind::kTimeout)) {
      EXPECT_EQ(e.kind, static_cast<int32_t>(lamport::ErrorKind::kAborted));
      continue;
    }
    ++timed_out;
    EXPECT_EQ(e.op, static_cast<int32_t>(op)) << "rank " << rank;
    EXPECT_EQ(e.parity, 0);
    EXPECT_EQ(e.slot, 3) << "rank " << rank;
    EXPECT_EQ(e.column / 8 / kOwnerFrags, owner(rank)) << "rank " << rank << " column " << e.column;
  }
  EXPECT_GE(timed_out, 1);
  EXPECT_EQ(f.late_entry, lamport::kAbortedEntry);
}

TEST(TwoShotProtocol, AbsentRankIsNamedByTheReducesWaitingOnIt) {
  // Every owner's reduces wait on rank 3's push; the gather polls behind them wait
  // longer, so no record names an owner that is only waiting itself.
  expect_named(one_call_with_rank_3(false), Op::kTwoShotReduce, [](int rank) { return rank; });
}

TEST(TwoShotProtocol, AbsentOwnerIsNamedByTheGather) {
  // Rank 3 pushes but never reduces: every other rank gets owners 0-2's sums and
  // times out on a column of owner 3.
  expect_named(one_call_with_rank_3(true), Op::kTwoShotGather, [](int) { return 3; });
}

TEST(TwoShotProtocol, GatherPollLeavesOnAPeersAbort) {
  HostTeam team(2, std::chrono::seconds(30));
  const Boxes b = add_boxes(team, 2);
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    lamport::Memory mem(1'000'000'000ull);
    lamport::time_out(mem, team.team_ref(1), Call{Op::kTwoShotReduce, 0}, 0, 0, 0);
  });
  const auto start = std::chrono::steady_clock::now();
  lamport::Memory mem(30'000'000'000ull);
  Fragment got;
  EXPECT_FALSE(lamport::two_shot_collect(mem, team.team_ref(0), team.box_ref(b.gather), Call{Op::kTwoShotGather, 0},
                                         0, 0, kOwnerFrags, &got));
  aborter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "the poll ignored the abort word";
  EXPECT_EQ(team.error(0).kind, static_cast<int32_t>(lamport::ErrorKind::kAborted));
  EXPECT_EQ(team.error(0).slot, 1) << "names the rank that aborted";
}

}  // namespace
}  // namespace tpdecode::test
