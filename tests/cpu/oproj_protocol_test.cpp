// The o-projection's use of the mailbox protocol, driven by CPU threads with the
// device's memory policy (protocol_harness.hpp): producer CTAs that enter with
// begin() only and push (one_shot_push; two-shot: two_shot_push to the owner),
// consumer CTAs that enter, take tickets, collect (one_shot_collect; two-shot:
// two_shot_reduce of the owned chunks, then two_shot_collect) and advance the
// epoch, in the orders the kernels allow on one rank's stream:
//  - producer + consumer: the producer of use u starts after the consumer of use
//    u-1 completed; its consumer starts once every producer CTA has entered (the
//    early consumer, one rank per GPU) or after the producer completed (and the
//    two-shot consumer);
//  - fused: both roles in one launch, every CTA ticketing; the launch of use u
//    starts after the launch of use u-1 completed.
// Random delays and torn stores; every sum checked, no push lands on published
// data, nothing left published; a producer that never pushes times out every
// consumer, names its slot and aborts the team.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "cpu/protocol_harness.hpp"

namespace tpdecode::test {
namespace {

using lamport::Call;
using lamport::Op;

constexpr int kRows = 2;

enum class Kind { kEarlyConsumer, kLateConsumer, kFused, kTwoShot };

struct Tally {
  std::atomic<long> overwrites{0}, wrong{0}, failed{0}, aborted{0};
};

// What every rank's consumer must find at (row, frag) in use u.
template <int kRanks>
Fragment rank_order_sum(int u, int row, int frag) {
  Fragment raw[kRanks];
  for (int s = 0; s < kRanks; ++s) raw[s] = lamport::clean(round_data(u, s, row, frag));
  return lamport::sum_rank_order<kRanks>(raw);
}

bool equal_fragments(const Fragment& a, const Fragment& b) {
  return a.w[0] == b.w[0] && a.w[1] == b.w[1] && a.w[2] == b.w[2] && a.w[3] == b.w[3];
}

// Per rank: how far its kernels have got (monotonic counts of CTAs).
struct Progress {
  std::atomic<long> producers_entered{0}, producers_done{0}, consumers_done{0};
};

void wait_until(const std::atomic<long>& v, long at_least) {
  while (v.load() < at_least) std::this_thread::yield();
}

template <int kRanks>
class StreamRun {
 public:
  // Two fragments per owner and row: every two-shot owner has chunks to reduce.
  static constexpr int kFrags = 2 * kRanks;
  static constexpr int kItems = kRows * kFrags;
  static constexpr int kOwnerFrags = kFrags / kRanks;

  StreamRun(Kind kind, int producers, int consumers, int uses, std::chrono::milliseconds timeout)
      : kind_(kind), np_(producers), nc_(consumers), uses_(uses), team_(kRanks, timeout) {
    box_ = team_.add_mailbox(2, kRanks, kRows, kFrags);
    recv_ = team_.add_mailbox(2, kRanks, kRows, kOwnerFrags);
    gather_ = team_.add_mailbox(2, 1, kRows, kFrags, recv_);
  }
  // The mailbox whose counter the calls advance.
  int epoch_box() const { return kind_ == Kind::kTwoShot ? recv_ : box_; }

  // absent: a rank whose producers never push in use `absent_use` (none: -1).
  void go(Tally& n, int absent_rank = -1, int absent_use = -1) {
    std::vector<std::thread> threads;
    for (int rank = 0; rank < kRanks; ++rank) {
      for (int p = 0; p < np_; ++p)
        threads.emplace_back([&, rank, p] { producer(rank, p, n, absent_rank, absent_use); });
      for (int c = 0; c < nc_; ++c) threads.emplace_back([&, rank, c] { consumer(rank, c, n); });
    }
    for (auto& t : threads) t.join();
  }

  HostTeam& team() { return team_; }

 private:
  // CTAs that count toward the epoch's advance.
  unsigned ticketing() const { return static_cast<unsigned>(kind_ == Kind::kFused ? np_ + nc_ : nc_); }

  // Launch u may start once the previous launch on the stream completed.
  void wait_for_previous_use(Progress& pr, int u) const {
    wait_until(pr.consumers_done, static_cast<long>(nc_) * u);
    if (kind_ == Kind::kFused) wait_until(pr.producers_done, static_cast<long>(np_) * u);
  }

  void producer(int rank, int p, Tally& n, int absent_rank, int absent_use) {
    std::mt19937 rng(static_cast<unsigned>(rank * 1009 + p * 31 + 1));
    Progress& pr = progress_[rank];
    const lamport::TeamRef t = team_.team_ref(rank);
    const lamport::MailboxRef box = team_.box_ref(epoch_box());
    for (int u = 0; u < uses_; ++u) {
      wait_for_previous_use(pr, u);
      CheckedMemory mem(team_.timeout(), &n.overwrites, &rng);
      uint32_t epoch = 0;
      const uint32_t entry = lamport::begin(mem, t, box, Op::kOproj, &epoch);
      pr.producers_entered.fetch_add(1);
      if ((rng() & 7u) == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));  // the GEMM
      if (entry != lamport::kAbortedEntry && !(rank == absent_rank && u == absent_use)) {
        const Call call{Op::kOproj, static_cast<int>(entry)};
        for (int i = p; i < kItems; i += np_) {
          const Fragment mine = round_data(u, rank, i / kFrags, i % kFrags);
          if (kind_ == Kind::kTwoShot)
            lamport::two_shot_push(mem, t, box, call, i / kFrags, i % kFrags, kOwnerFrags, mine);
          else
            lamport::one_shot_push<kRanks>(mem, t, box, call, i / kFrags, i % kFrags, mine);
        }
        if (kind_ == Kind::kFused)
          lamport::advance_if_last(mem, t, box, epoch, lamport::take_ticket(mem, t, box), ticketing());
      }
      pr.producers_done.fetch_add(1);
    }
  }

  void consumer(int rank, int c, Tally& n) {
    std::mt19937 rng(static_cast<unsigned>(rank * 7919 + c * 17 + 5));
    Progress& pr = progress_[rank];
    const lamport::TeamRef t = team_.team_ref(rank);
    const lamport::MailboxRef box = team_.box_ref(epoch_box());
    const lamport::MailboxRef gather = team_.box_ref(gather_);
    for (int u = 0; u < uses_; ++u) {
      if (kind_ == Kind::kEarlyConsumer) {
        wait_until(pr.producers_entered, static_cast<long>(np_) * (u + 1));
      } else if (kind_ == Kind::kFused) {
        wait_for_previous_use(pr, u);
      } else {
        wait_until(pr.producers_done, static_cast<long>(np_) * (u + 1));
      }
      CheckedMemory mem(team_.timeout(), &n.overwrites, &rng);
      uint32_t epoch = 0;
      const uint32_t entry = lamport::begin(mem, t, box, Op::kOproj, &epoch);
      if (entry == lamport::kAbortedEntry) {
        n.aborted.fetch_add(1);
      } else {
        const Call call{Op::kOproj, static_cast<int>(entry)};
        const uint32_t ticket = lamport::take_ticket(mem, t, box);
        bool ok = true;
        if (kind_ == Kind::kTwoShot) {  // every owned chunk reduced before any gather poll
          for (int j = c; ok && j < kRows * kOwnerFrags; j += nc_)
            ok = lamport::two_shot_reduce<kRanks>(mem, t, box, gather, call, j / kOwnerFrags, j % kOwnerFrags,
                                                  kOwnerFrags);
          lamport::two_shot_gather_phase(mem, t);
        }
        for (int i = c; ok && i < kItems; i += nc_) {
          Fragment sum;
          ok = kind_ == Kind::kTwoShot
                   ? lamport::two_shot_collect(mem, t, gather, call, i / kFrags, i % kFrags, kOwnerFrags, &sum)
                   : lamport::one_shot_collect<kRanks>(mem, t, box, call, i / kFrags, i % kFrags, &sum);
          if (ok && !equal_fragments(sum, rank_order_sum<kRanks>(u, i / kFrags, i % kFrags))) n.wrong.fetch_add(1);
        }
        if (!ok) n.failed.fetch_add(1);
        lamport::advance_if_last(mem, t, box, epoch, ticket, ticketing());
      }
      pr.consumers_done.fetch_add(1);
    }
  }

  Kind kind_;
  int np_, nc_, uses_;
  HostTeam team_;
  int box_ = 0, recv_ = 0, gather_ = 0;
  Progress progress_[kRanks];
};

template <int kRanks>
void expect_clean_uses(Kind kind, int producers, int consumers, int uses) {
  StreamRun<kRanks> run(kind, producers, consumers, uses, std::chrono::seconds(20));
  Tally n;
  run.go(n);
  EXPECT_EQ(n.wrong.load(), 0);
  EXPECT_EQ(n.failed.load(), 0);
  EXPECT_EQ(n.aborted.load(), 0);
  EXPECT_EQ(n.overwrites.load(), 0);
  EXPECT_TRUE(run.team().all_armed());
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(run.team().error(r).flag, 0u);
    EXPECT_EQ(run.team().control(r).mailbox[run.epoch_box()].epoch, static_cast<uint32_t>(uses)) << "rank " << r;
  }
}

TEST(OprojProtocol, EarlyConsumerOverlappingItsProducer) {
  expect_clean_uses<2>(Kind::kEarlyConsumer, 3, 2, 2000);
  expect_clean_uses<4>(Kind::kEarlyConsumer, 2, 3, 1000);
  expect_clean_uses<8>(Kind::kEarlyConsumer, 2, 2, 300);
}

TEST(OprojProtocol, ConsumerAfterItsProducer) {
  expect_clean_uses<2>(Kind::kLateConsumer, 2, 2, 2000);
  expect_clean_uses<4>(Kind::kLateConsumer, 3, 2, 1000);
}

TEST(OprojProtocol, FusedEveryCtaTicketing) {
  expect_clean_uses<2>(Kind::kFused, 3, 2, 2000);
  expect_clean_uses<4>(Kind::kFused, 2, 2, 1000);
  expect_clean_uses<8>(Kind::kFused, 2, 3, 300);
}

TEST(OprojProtocol, TwoShotOwnersReduceThenGather) {
  expect_clean_uses<2>(Kind::kTwoShot, 3, 2, 2000);
  expect_clean_uses<4>(Kind::kTwoShot, 2, 3, 1000);
  expect_clean_uses<8>(Kind::kTwoShot, 2, 2, 300);
}

TEST(OprojProtocol, AnAbsentProducerTimesOutEveryConsumerAndAbortsTheTeam) {
  constexpr int kRanks = 4;
  for (Kind kind : {Kind::kEarlyConsumer, Kind::kFused, Kind::kTwoShot}) {
    StreamRun<kRanks> run(kind, 2, 2, 6, std::chrono::milliseconds(200));
    Tally n;
    run.go(n, kRanks - 1, 3);  // the last rank never pushes in use 3
    EXPECT_EQ(n.wrong.load(), 0) << "a failed call must never deliver a wrong sum";
    EXPECT_GT(n.failed.load(), 0);
    EXPECT_GT(n.aborted.load(), 0) << "the uses after the failure find the team aborted on entry";
    for (int r = 0; r < kRanks; ++r) {
      const lamport::ErrorRecord& e = run.team().error(r);
      ASSERT_EQ(e.flag, 1u) << "rank " << r;
      const bool named = e.kind == static_cast<int32_t>(lamport::ErrorKind::kTimeout) && e.slot == kRanks - 1;
      const bool saw_abort = e.kind == static_cast<int32_t>(lamport::ErrorKind::kAborted);
      EXPECT_TRUE(named || saw_abort) << "rank " << r << " kind " << e.kind << " slot " << e.slot;
      EXPECT_EQ(e.op, static_cast<int32_t>(Op::kOproj));
      EXPECT_NE(run.team().control(r).abort, 0u);
    }
  }
}

}  // namespace
}  // namespace tpdecode::test
