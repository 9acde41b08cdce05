// The memory policy of the mailbox protocol (protocol.hpp), one class for both
// drivers: on the device, PTX loads and stores with the semantics the protocol's
// ordering argument names; on the host (the CPU protocol tests), std::atomic_ref
// per 32-bit word, so 16-byte fragments tear there as they may on the GPU. The poll
// cadence (when the deadline and the abort word are read) is the same code on both.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#define TPD_UNROLL _Pragma("unroll")
#else
#define TPD_UNROLL
#endif

#if !defined(__CUDA_ARCH__)
#include <atomic>
#include <chrono>
#include <thread>
#endif

#include "core/bf16.hpp"  // TPD_HD

namespace tpdecode::lamport {

struct alignas(16) Fragment {
  uint32_t w[4];
};

enum class PollCheck : int { kContinue = 0, kExpired, kAborted };

class Memory {
 public:
  // Why every 32 polls: a timer read costs more than a poll of an L2-resident line.
  static constexpr uint32_t kCheckEvery = 32;
  // Why only after 20 us of polling: the abort word is a load the loop must wait
  // for; a call whose peers are alive is done in a few microseconds and never pays
  // it, and a peer's abort is still seen within microseconds of the 20.
  static constexpr uint64_t kAbortCheckAfterNs = 20000;

  TPD_HD explicit Memory(uint64_t timeout_ns) : start_ns_(now_ns()), deadline_ns_(start_ns_ + timeout_ns) {}

  // A poll of the caller's own memory, which peers store into.
  TPD_HD Fragment poll(const Fragment* p) const {
#if defined(__CUDA_ARCH__)
    Fragment f;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(f.w[0]), "=r"(f.w[1]), "=r"(f.w[2]), "=r"(f.w[3])
                 : "l"(p)
                 : "memory");
    return f;
#else
    Fragment f;
    for (int j = 0; j < 4; ++j) f.w[j] = host_load(&p->w[j]);
    return f;
#endif
  }

  // A push into a peer's slot, or a re-arm of the caller's own: system scope.
  TPD_HD void push(Fragment* p, const Fragment& f) const {
#if defined(__CUDA_ARCH__)
    asm volatile("st.relaxed.sys.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(f.w[0]), "r"(f.w[1]),
                 "r"(f.w[2]), "r"(f.w[3])
                 : "memory");
#else
    for (int j = 0; j < 4; ++j) std::atomic_ref<uint32_t>(p->w[j]).store(f.w[j], std::memory_order_release);
#endif
  }

  TPD_HD uint32_t load_word(const uint32_t* p) const {
#if defined(__CUDA_ARCH__)
    uint32_t v;
    asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#else
    return host_load(p);
#endif
  }

  TPD_HD void store_word(uint32_t* p, uint32_t v) const {
#if defined(__CUDA_ARCH__)
    asm volatile("st.relaxed.sys.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#else
    std::atomic_ref<uint32_t>(*p).store(v, std::memory_order_release);
#endif
  }

  // Arrival on a counter of this GPU: returns the old value. Relaxed on the device
  // (what orders it is protocol.hpp's business: see begin() and arrive());
  // acquire-release on the host. On the device only lane 0 of the calling warp
  // arrives (the others get 0). Why the lane test inside the asm: without it ptxas
  // aggregates the atomic over the warp and broadcasts its result with a shuffle
  // that waits for the round trip at once, stalling the warp that took the ticket
  // before its polls; this way the result is waited for where it is first read.
  TPD_HD uint32_t arrive(uint32_t* p) const {
#if defined(__CUDA_ARCH__)
    uint32_t old;
    asm volatile(
        "{\n\t.reg .pred leader;\n\t.reg .u32 lane;\n\tmov.u32 lane, %%laneid;\n\t"
        "setp.eq.u32 leader, lane, 0;\n\tmov.u32 %0, 0;\n\t"
        "@leader atom.relaxed.gpu.global.add.u32 %0, [%1], %2;\n\t}"
        : "=r"(old)
        : "l"(p), "r"(1u)
        : "memory");
    return old;
#else
    return std::atomic_ref<uint32_t>(*p).fetch_add(1u, std::memory_order_acq_rel);
#endif
  }

  // Compare-and-swap among this GPU's threads (the error record: host-mapped, only
  // read by the host; why not system scope: system-scoped atomics on mapped host
  // memory are not allowed on every platform, and compute-sanitizer flags them).
  TPD_HD bool cas_word(uint32_t* p, uint32_t expected, uint32_t desired) const {
#if defined(__CUDA_ARCH__)
    return atomicCAS(p, expected, desired) == expected;
#else
    return std::atomic_ref<uint32_t>(*p).compare_exchange_strong(expected, desired, std::memory_order_acq_rel);
#endif
  }

  TPD_HD void fence_system() const {
#if defined(__CUDA_ARCH__)
    __threadfence_system();
#else
    std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
  }

  // Moves the deadline `ns` later (a later phase of a call that may wait longer).
  TPD_HD void extend_deadline(uint64_t ns) { deadline_ns_ += ns; }

  // Called once per round of polls: every kCheckEvery rounds, the abort word (once
  // the poll has waited kAbortCheckAfterNs), then the deadline.
  TPD_HD PollCheck check(const uint32_t* abort_word) {
#if !defined(__CUDA_ARCH__)
    std::this_thread::yield();  // more rank threads than cores: let the writers run
#endif
    if ((++polls_ % kCheckEvery) != 0) return PollCheck::kContinue;
    const uint64_t now = now_ns();
    if (now > start_ns_ + kAbortCheckAfterNs && load_word(abort_word) != 0) return PollCheck::kAborted;
    return now > deadline_ns_ ? PollCheck::kExpired : PollCheck::kContinue;
  }

 private:
  TPD_HD static uint64_t now_ns() {
#if defined(__CUDA_ARCH__)
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#else
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
#endif
  }
#if !defined(__CUDA_ARCH__)
  static uint32_t host_load(const uint32_t* p) {
    return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(p)).load(std::memory_order_acquire);
  }
#endif

  uint64_t start_ns_;
  uint64_t deadline_ns_;
  uint32_t polls_ = 0;
};

}  // namespace tpdecode::lamport
