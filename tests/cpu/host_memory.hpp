// The CPU-thread driver of the Lamport protocol (lamport_protocol.hpp): each
// 32-bit word is accessed atomically (16-byte fragments are NOT atomic, as on the
// GPU), polls are acquire loads, pushes and re-arms release stores. A checked
// store flags any push into a slot that still holds unread data.
#pragma once

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "comm/lamport_protocol.hpp"

namespace tpdecode::test {

struct HostMemory {
  std::chrono::steady_clock::time_point deadline;
  std::atomic<long>* overwrites = nullptr;  // pushes that found unread data
  std::mt19937* jitter = nullptr;           // random delays between word stores

  explicit HostMemory(std::chrono::milliseconds timeout, std::atomic<long>* overwrite_count = nullptr,
                      std::mt19937* rng = nullptr)
      : deadline(std::chrono::steady_clock::now() + timeout), overwrites(overwrite_count), jitter(rng) {}

  static uint32_t word(const uint32_t& w) {
    return std::atomic_ref<uint32_t>(const_cast<uint32_t&>(w)).load(std::memory_order_acquire);
  }

  lamport::Fragment load(const lamport::Fragment* p) {
    lamport::Fragment f;
    for (int j = 0; j < 4; ++j) f.w[j] = word(p->w[j]);
    return f;
  }

  void store(lamport::Fragment* p, lamport::Fragment f) {
    const bool push = lamport::published(f);
    if (push && overwrites) {
      for (int j = 0; j < 4; ++j)
        if (word(p->w[j]) != lamport::kSentinel) {
          overwrites->fetch_add(1);
          break;
        }
    }
    for (int j = 0; j < 4; ++j) {
      std::atomic_ref<uint32_t>(p->w[j]).store(f.w[j], std::memory_order_release);
      if (jitter && ((*jitter)() & 7u) == 0) std::this_thread::yield();  // tear the fragment sometimes
    }
  }

  // Why yield: more rank threads than cores; a spinning poll must let the writer run.
  bool expired() const {
    std::this_thread::yield();
    return std::chrono::steady_clock::now() > deadline;
  }
};

}  // namespace tpdecode::test
