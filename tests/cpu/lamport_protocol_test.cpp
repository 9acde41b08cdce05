// The mailbox protocol driven by CPU threads, one per rank: the same push / poll /
// re-arm / parity logic the kernels run (lamport_protocol.hpp), with random delays.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "comm/lamport_protocol.hpp"
#include "cpu/host_memory.hpp"
#include "tpdecode/bf16.hpp"
#include "reference/all_reduce.hpp"

namespace tpdecode {
namespace {

using lamport::Fragment;

// Every rank's mailbox: [parities, slots = ranks, rows, frags] fragments, armed.
struct Mailboxes {
  int ranks, parities, rows, frags;
  std::vector<std::vector<Fragment>> copy;  // [rank] -> that rank's buffer
  Mailboxes(int r, int p, int rw, int f) : ranks(r), parities(p), rows(rw), frags(f) {
    copy.assign(static_cast<std::size_t>(r), std::vector<Fragment>(static_cast<std::size_t>(p * r * rw * f), lamport::armed()));
  }
  Fragment* at(int owner, int parity, int slot, int row, int frag) {
    return &copy[static_cast<std::size_t>(owner)][static_cast<std::size_t>(((parity * ranks + slot) * rows + row) * frags + frag)];
  }
};

// What rank `s` pushes in round `u`: small integers (exact FP32 sums) that encode
// the round, so a stale or foreign fragment is recognised.
Fragment round_data(int u, int s, int row, int frag) {
  Fragment f;
  for (int j = 0; j < 4; ++j) {
    const float lo = static_cast<float>((u * 7 + s * 3 + row * 5 + frag + j) % 200 + 1);
    const float hi = -static_cast<float>(s + 1 + u % 5);
    f.w[j] = bf16::pack(bf16::from_float(lo), bf16::from_float(hi));
  }
  return f;
}

struct RunResult {
  long overwrites = 0;
  long stale_or_wrong = 0;
  long timeouts = 0;
  long rounds_done = 0;
};

// `kRanks` threads run `rounds` one-shot all-reduces over `parities` mailboxes;
// `slow_rank` (if >= 0) sleeps before its first poll of round 0.
template <int kRanks>
RunResult run_protocol(int rounds, int parities, int slow_rank, std::chrono::milliseconds timeout) {
  constexpr int kRows = 2, kFrags = 3;
  Mailboxes box(kRanks, parities, kRows, kFrags);
  std::atomic<long> overwrites{0}, wrong{0}, timeouts{0}, done{0};
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      std::mt19937 rng(static_cast<unsigned>(rank * 7919 + 17));
      for (int u = 0; u < rounds; ++u) {
        const int parity = u % parities;
        test::HostMemory mem(timeout, &overwrites, &rng);
        for (int row = 0; row < kRows; ++row)
          for (int frag = 0; frag < kFrags; ++frag)
            lamport::push_to_all<kRanks>(
                mem, [&](int peer) { return box.at(peer, parity, rank, row, frag); }, round_data(u, rank, row, frag));
        if (u == 0 && rank == slow_rank) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if ((rng() & 15u) == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
        for (int row = 0; row < kRows; ++row)
          for (int frag = 0; frag < kFrags; ++frag) {
            auto slot_of = [&](int s) { return box.at(rank, parity, s, row, frag); };
            Fragment raw[kRanks];
            if (lamport::wait_all<kRanks>(mem, slot_of, raw) >= 0) {
              timeouts.fetch_add(1);
              return;
            }
            lamport::rearm<kRanks>(mem, slot_of);
            for (int s = 0; s < kRanks; ++s) {
              const Fragment want = lamport::clean(round_data(u, s, row, frag));
              for (int j = 0; j < 4; ++j)
                if (raw[s].w[j] != want.w[j]) {
                  wrong.fetch_add(1);
                  break;
                }
            }
          }
        // Why: the kernel boundary between two calls orders this call's polls and
        // re-arms before the next call's pushes (lamport_protocol.hpp, (1) and (2)).
        std::atomic_thread_fence(std::memory_order_seq_cst);
        done.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  return RunResult{overwrites.load(), wrong.load(), timeouts.load(), done.load()};
}

TEST(LamportProtocol, TenThousandRoundsAlternatingParityFourRanks) {
  const RunResult r = run_protocol<4>(10000, 2, -1, std::chrono::seconds(20));
  EXPECT_EQ(r.overwrites, 0);
  EXPECT_EQ(r.stale_or_wrong, 0);
  EXPECT_EQ(r.timeouts, 0);
  EXPECT_EQ(r.rounds_done, 4 * 10000);
}

TEST(LamportProtocol, TenThousandRoundsAlternatingParityEightRanks) {
  const RunResult r = run_protocol<8>(10000, 2, 3, std::chrono::seconds(20));
  EXPECT_EQ(r.overwrites, 0);
  EXPECT_EQ(r.stale_or_wrong, 0);
  EXPECT_EQ(r.timeouts, 0);
  EXPECT_EQ(r.rounds_done, 8 * 10000);
}

TEST(LamportProtocol, OneMailboxWithoutParityIsCaught) {
  // The checks have teeth: with a single mailbox a fast rank pushes round 1 into a
  // slot the slow rank has not read yet, which the checked store reports (and the
  // lost data then shows up as wrong data or a timeout).
  const RunResult r = run_protocol<2>(50, 1, 1, std::chrono::milliseconds(300));
  EXPECT_GT(r.overwrites + r.stale_or_wrong + r.timeouts, 0);
}

TEST(LamportProtocol, AbsentRankTimesOutWithTheMissingSlot) {
  constexpr int kRanks = 4;
  Mailboxes box(kRanks, 2, 1, 1);
  // Ranks 0..2 push; rank 3 never does.
  test::HostMemory mem(std::chrono::milliseconds(100));
  for (int rank = 0; rank < 3; ++rank)
    lamport::push_to_all<kRanks>(mem, [&](int peer) { return box.at(peer, 0, rank, 0, 0); }, round_data(0, rank, 0, 0));
  Fragment raw[kRanks];
  const auto start = std::chrono::steady_clock::now();
  const int missing = lamport::wait_all<kRanks>(mem, [&](int s) { return box.at(0, 0, s, 0, 0); }, raw);
  EXPECT_EQ(missing, 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST(LamportProtocol, TornFragmentIsNotPublished) {
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

TEST(LamportProtocol, ThreadAllReduceMatchesReferenceWithSentinelWords) {
  // A full one-shot all-reduce of random BF16 data with planted sentinel words,
  // by CPU threads over the protocol, equals the reference bit for bit.
  constexpr int kRanks = 4, kFrags = 16;
  std::mt19937 rng(99);
  std::vector<std::vector<uint16_t>> parts(kRanks, std::vector<uint16_t>(kFrags * 8));
  std::normal_distribution<float> dist;
  for (auto& p : parts)
    for (auto& v : p) v = bf16::from_float(dist(rng));
  parts[1][6] = 0x0000;
  parts[1][7] = 0x8000;
  parts[3][0] = 0x0000;
  parts[3][1] = 0x8000;
  Mailboxes box(kRanks, 2, 1, kFrags);
  std::vector<std::vector<uint16_t>> out(kRanks, std::vector<uint16_t>(kFrags * 8));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank)
    threads.emplace_back([&, rank] {
      test::HostMemory mem(std::chrono::seconds(10));
      for (int f = 0; f < kFrags; ++f) {
        Fragment mine;
        for (int j = 0; j < 4; ++j) mine.w[j] = bf16::pack(parts[rank][f * 8 + 2 * j], parts[rank][f * 8 + 2 * j + 1]);
        lamport::push_to_all<kRanks>(mem, [&](int peer) { return box.at(peer, 1, rank, 0, f); }, mine);
      }
      for (int f = 0; f < kFrags; ++f) {
        Fragment raw[kRanks];
        auto slot_of = [&](int s) { return box.at(rank, 1, s, 0, f); };
        ASSERT_EQ(lamport::wait_all<kRanks>(mem, slot_of, raw), -1);
        lamport::rearm<kRanks>(mem, slot_of);
        const Fragment sum = lamport::sum_rank_order<kRanks>(raw);
        for (int j = 0; j < 4; ++j) {
          out[rank][f * 8 + 2 * j] = static_cast<uint16_t>(sum.w[j] & 0xffff);
          out[rank][f * 8 + 2 * j + 1] = static_cast<uint16_t>(sum.w[j] >> 16);
        }
      }
    });
  for (auto& t : threads) t.join();
  const std::vector<uint16_t> ref = reference::all_reduce(parts);
  for (int rank = 0; rank < kRanks; ++rank) EXPECT_EQ(out[rank], ref) << "rank " << rank;
  for (const auto& c : box.copy)
    for (const Fragment& f : c) EXPECT_FALSE(lamport::published(f)) << "a slot was left un-armed";
}

}  // namespace
}  // namespace tpdecode
