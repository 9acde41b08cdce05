// A team of CPU threads running the collectives' own bodies (collectives.hpp) over
// the protocol (protocol.hpp) with the device's memory policy compiled for the
// host (memory.hpp): every rank has a control block, an error record and mailbox
// copies in host memory; a CheckedMemory adds torn stores and an overwrite check.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "comm/collectives.hpp"
#include "tpdecode/bf16.hpp"

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

  void push(Fragment* p, const Fragment& f) const {
    if (overwrites_ && lamport::published(f) && lamport::published(poll(p))) overwrites_->fetch_add(1);
    for (int j = 0; j < 4; ++j) {
      std::atomic_ref<uint32_t>(p->w[j]).store(f.w[j], std::memory_order_release);
      if (jitter_ && ((*jitter_)() & 7u) == 0) std::this_thread::yield();  // tear the fragment sometimes
    }
  }

 private:
  std::atomic<long>* overwrites_;
  std::mt19937* jitter_;
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

  // A mailbox [parities, slots, rows_cap, frags · 16 bytes] on every rank; returns its index.
  int add_mailbox(int parities, int slots, int rows_cap, int frags) {
    const auto n = static_cast<std::size_t>(parities * slots * rows_cap * frags);
    Box b;
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
    m.index = index;
    return m;
  }

  const lamport::ErrorRecord& error(int rank) const { return errors_.at(static_cast<std::size_t>(rank)); }
  const lamport::ControlBlock& control(int rank) const { return control_.at(static_cast<std::size_t>(rank)); }
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
    int parities, slots, rows_cap, frags;
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
inline Fragment round_data(int u, int s, int row, int frag) {
  Fragment f;
  for (int j = 0; j < 4; ++j) {
    const float lo = static_cast<float>((u * 7 + s * 3 + row * 5 + frag + j) % 200 + 1);
    const float hi = -static_cast<float>(s + 1 + u % 5);
    f.w[j] = bf16::pack(bf16::from_float(lo), bf16::from_float(hi));
  }
  return f;
}

}  // namespace tpdecode::test
