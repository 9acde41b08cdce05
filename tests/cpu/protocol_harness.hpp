// A team of CPU threads running the collectives' own bodies (collectives.hpp) over
// the protocol (protocol.hpp) with the device's memory policy compiled for the
// host (memory.hpp): every rank has a control block, an error record and mailbox
// copies in host memory; a CheckedMemory adds torn stores and an overwrite check.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "comm/collectives.hpp"
#include "core/bf16.hpp"

namespace tpdecode::test {

using lamport::Fragment;

// The device policy, with a push that tears fragments (a yield between words,
// sometimes) and counts pushes that land on a slot still holding published data.
class CheckedMemory : public lamport::Memory {
 public:
  CheckedMemory(std::chrono::milliseconds timeout, std::atomic<long>* overwrites, std::mt19937* jitter)
      : Memory(static_cast<uint64_t>(std::chrono::nanoseconds(timeout).count())),
        overwrites_(overwrites),
        jitter_(jitter) {}

  // From now on, re-arms (pushes of the sentinel) sleep `delay` once in `one_in` (a
  // slow reader: a fast peer may finish the call and start the next meanwhile).
  void slow_rearms(std::chrono::microseconds delay, unsigned one_in) {
    rearm_delay_ = delay;
    rearm_one_in_ = one_in;
  }

  void push(Fragment* p, const Fragment& f) const {
    if (overwrites_ && lamport::published(f) && lamport::published(poll(p))) overwrites_->fetch_add(1);
    if (!lamport::published(f) && rearm_delay_.count() > 0 &&
        (rearm_one_in_ <= 1 || (jitter_ && (*jitter_)() % rearm_one_in_ == 0)))
      std::this_thread::sleep_for(rearm_delay_);
    for (int j = 0; j < 4; ++j) {
      std::atomic_ref<uint32_t>(p->w[j]).store(f.w[j], std::memory_order_release);
      if (jitter_ && ((*jitter_)() & 7u) == 0) std::this_thread::yield();  // tear the fragment sometimes
    }
  }

 private:
  std::atomic<long>* overwrites_;
  std::mt19937* jitter_;
  std::chrono::microseconds rearm_delay_{0};
  unsigned rearm_one_in_ = 1;
};

// Every rank's control block, error record and mailbox copies.
class HostTeam {
 public:
  HostTeam(int ranks, std::chrono::milliseconds timeout) : ranks_(ranks), timeout_(timeout) {
    control_.resize(static_cast<std::size_t>(ranks));
    errors_.resize(static_cast<std::size_t>(ranks));
  }
  int size() const { return ranks_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // A mailbox [parities, slots, rows_cap, frags · 16 bytes] on every rank; returns its
  // index. Its epoch counter is its index, or mailbox `epoch_of`'s (shared).
  int add_mailbox(int parities, int slots, int rows_cap, int frags, int epoch_of = -1) {
    const auto n = static_cast<std::size_t>(parities * slots * rows_cap * frags);
    Box b;
    b.epoch = epoch_of >= 0 ? epoch_of : static_cast<int>(boxes_.size());
    b.parities = parities;
    b.slots = slots;
    b.rows_cap = rows_cap;
    b.frags = frags;
    b.copies.assign(static_cast<std::size_t>(ranks_), std::vector<Fragment>(n, lamport::armed()));
    boxes_.push_back(std::move(b));
    return static_cast<int>(boxes_.size()) - 1;
  }

  lamport::TeamRef team_ref(int rank) {
    lamport::TeamRef t{};
    for (int r = 0; r < ranks_; ++r) t.control[r] = &control_[static_cast<std::size_t>(r)];
    t.error = &errors_[static_cast<std::size_t>(rank)];
    t.timeout_ns = static_cast<uint64_t>(std::chrono::nanoseconds(timeout_).count());
    t.rank = rank;
    t.size = ranks_;
    t.own = t.control[rank];
    return t;
  }

  lamport::MailboxRef box_ref(int index) {
    Box& b = boxes_.at(static_cast<std::size_t>(index));
    lamport::MailboxRef m{};
    for (int r = 0; r < ranks_; ++r) m.base[r] = reinterpret_cast<char*>(b.copies[static_cast<std::size_t>(r)].data());
    m.row_bytes = b.frags * 16L;
    m.parity_bytes = static_cast<long>(b.slots) * b.rows_cap * m.row_bytes;
    m.rows_cap = b.rows_cap;
    m.parities = b.parities;
    m.index = b.epoch;
    return m;
  }

  const lamport::ErrorRecord& error(int rank) const { return errors_.at(static_cast<std::size_t>(rank)); }
  // Whether `rank` has reported a failure (its record complete), read while the
  // ranks' threads run.
  bool reported(int rank) const {
    auto& flag = const_cast<uint32_t&>(errors_.at(static_cast<std::size_t>(rank)).flag);
    return std::atomic_ref<uint32_t>(flag).load(std::memory_order_acquire) == 1;
  }
  const lamport::ControlBlock& control(int rank) const { return control_.at(static_cast<std::size_t>(rank)); }
  // Sets epoch counter `index` of every rank (a run that starts late in the count).
  void set_epoch(int index, uint32_t epoch) {
    for (lamport::ControlBlock& c : control_) c.mailbox[index].epoch = epoch;
  }
  // Every slot of every mailbox copy armed (nothing left published).
  bool all_armed() const {
    for (const Box& b : boxes_)
      for (const auto& copy : b.copies)
        for (const Fragment& f : copy)
          if (lamport::published(f)) return false;
    return true;
  }

 private:
  struct Box {
    int parities, slots, rows_cap, frags, epoch;
    std::vector<std::vector<Fragment>> copies;  // [rank]
  };
  int ranks_;
  std::chrono::milliseconds timeout_;
  std::vector<lamport::ControlBlock> control_;
  std::vector<lamport::ErrorRecord> errors_;
  std::vector<Box> boxes_;
};

// What rank `s` sends in round `u` at (row, frag): small integers that encode the
// round and the rank, exact in FP32 sums, so stale or foreign data is recognised.
// One value depends on the order of the sum: the first word's high half is +2^30
// from rank 0 and -2^30 from rank 1, which cancel exactly in rank order; summed in
// another order, a small value added next to 2^30 is lost (its FP32 ulp is 128), so
// a sum that reads the ranks' slots out of order (a push into the wrong slot) is
// recognised from three ranks on (two values add alike either way).
inline Fragment round_data(int u, int s, int row, int frag) {
  Fragment f;
  for (int j = 0; j < 4; ++j) {
    const float lo = static_cast<float>((u * 7 + s * 3 + row * 5 + frag + j) % 200 + 1);
    float hi = -static_cast<float>(s + 1 + u % 5);
    if (j == 0 && s < 2) hi = s == 0 ? 0x1p30f : -0x1p30f;
    f.w[j] = bf16::pack(bf16::from_float(lo), bf16::from_float(hi));
  }
  return f;
}

// The rank-order sum of what every rank sends in round u.
inline Fragment expected_sum(int ranks, int u, int row, int frag) {
  Fragment out = lamport::clean(round_data(u, 0, row, frag));
  float lo[4], hi[4];
  for (int j = 0; j < 4; ++j) lo[j] = bf16::low_of(out.w[j]), hi[j] = bf16::high_of(out.w[j]);
  for (int s = 1; s < ranks; ++s) {
    const Fragment raw = lamport::clean(round_data(u, s, row, frag));
    for (int j = 0; j < 4; ++j) lo[j] += bf16::low_of(raw.w[j]), hi[j] += bf16::high_of(raw.w[j]);
  }
  for (int j = 0; j < 4; ++j) out.w[j] = bf16::pack_rounded(lo[j], hi[j]);
  return out;
}

inline bool same(const Fragment& a, const Fragment& b) {
  return a.w[0] == b.w[0] && a.w[1] == b.w[1] && a.w[2] == b.w[2] && a.w[3] == b.w[3];
}

// Outcomes of many calls, counted by every rank thread.
struct Counts {
  std::atomic<long> overwrites{0}, wrong{0}, failed{0}, aborted{0}, done{0};
};

// The deadline of the randomised rounds: TPDECODE_PROTOCOL_TIMEOUT_MS, else
// `fallback` (scripts/mutants.sh shortens it: a broken protocol then fails fast).
inline std::chrono::milliseconds protocol_timeout(std::chrono::milliseconds fallback) {
  const char* env = std::getenv("TPDECODE_PROTOCOL_TIMEOUT_MS");
  const long ms = env ? std::atol(env) : 0;
  return ms > 0 ? std::chrono::milliseconds(ms) : fallback;
}

// `rounds` calls on every rank of `team`, `ctas` CTAs each: one thread per CTA runs
// call(rank, cta, u, mem, rng) in round u with a fresh CheckedMemory counting into
// n.overwrites; a rank's CTAs meet at a barrier between calls (a kernel boundary).
template <class Call>
void run_cta_rounds(HostTeam& team, int ctas, int rounds, unsigned seed, Counts& n, Call call) {
  std::vector<std::unique_ptr<std::barrier<>>> boundary;
  for (int r = 0; r < team.size(); ++r) boundary.push_back(std::make_unique<std::barrier<>>(ctas));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < team.size(); ++rank)
    for (int cta = 0; cta < ctas; ++cta)
      threads.emplace_back([&, rank, cta] {
        std::mt19937 rng(static_cast<unsigned>(rank * 7919 + cta * 104729) + seed);
        for (int u = 0; u < rounds; ++u) {
          CheckedMemory mem(team.timeout(), &n.overwrites, &rng);
          call(rank, cta, u, mem, rng);
          boundary[static_cast<std::size_t>(rank)]->arrive_and_wait();
        }
        n.done.fetch_add(1);
      });
  for (auto& t : threads) t.join();
}

// A clean run of `rounds` calls: no push onto unread data, nothing stale or
// foreign read, no failure, every slot re-armed, one epoch per call on mailbox
// `epoch_box`'s counter, no error record.
// expect_clean_at: the same, mailbox `epoch_box`'s counter at `epoch` at the end.
inline void expect_clean_at(const HostTeam& team, const Counts& n, int epoch_box, uint32_t epoch) {
  EXPECT_EQ(n.overwrites, 0) << "a push landed on unread data";
  EXPECT_EQ(n.wrong, 0) << "stale or foreign data was read";
  EXPECT_EQ(n.failed, 0);
  EXPECT_EQ(n.aborted, 0);
  EXPECT_TRUE(team.all_armed()) << "a slot was left published";
  for (int r = 0; r < team.size(); ++r) {
    EXPECT_EQ(team.control(r).mailbox[epoch_box].epoch, epoch) << "rank " << r;
    EXPECT_EQ(team.control(r).mailbox[epoch_box].arrivals, 0u) << "rank " << r;
    EXPECT_EQ(team.error(r).flag, 0u) << "rank " << r;
  }
}

inline void expect_clean(const HostTeam& team, const Counts& n, int rounds, int epoch_box) {
  expect_clean_at(team, n, epoch_box, static_cast<uint32_t>(rounds));
}

// Rounds of the randomised tests: TPDECODE_PROTOCOL_ROUNDS, else `fallback`
// (scripts/mutants.sh runs fewer).
inline int protocol_rounds(int fallback) {
  const char* env = std::getenv("TPDECODE_PROTOCOL_ROUNDS");
  const int n = env ? std::atoi(env) : 0;
  return n > 0 ? n : fallback;
}

}  // namespace tpdecode::test
