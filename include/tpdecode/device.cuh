// The device-helper layer every kernel uses: programmatic dependent launch (PDL),
// the global timer, 16-byte loads and stores with the memory semantics the
// mailboxes need, asynchronous copies with L2 cache policies, and BF16 (bf16.hpp,
// shared with the host).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tpdecode/bf16.hpp"

namespace tpdecode::dev {

// ---- Programmatic dependent launch ------------------------------------------
// Lets the next kernel in the stream launch now: its prologue before pdl_wait()
// (e.g. a weight prefetch) overlaps this kernel's tail.
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
// Waits until the previous kernel in the stream completed and its stores are
// visible. No read of its outputs and no mailbox store may precede this.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- 16-byte memory operations ----------------------------------------------
struct alignas(16) Words4 {
  uint32_t w[4];
};

// A poll of memory that another GPU's thread may store into.
__device__ __forceinline__ Words4 load_volatile16(const void* p) {
  Words4 f;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(f.w[0]), "=r"(f.w[1]), "=r"(f.w[2]), "=r"(f.w[3])
               : "l"(p)
               : "memory");
  return f;
}
// A store that a thread on another GPU polls (system scope, relaxed).
__device__ __forceinline__ void store_relaxed_sys16(void* p, const Words4& f) {
  asm volatile("st.relaxed.sys.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(f.w[0]), "r"(f.w[1]),
               "r"(f.w[2]), "r"(f.w[3])
               : "memory");
}
__device__ __forceinline__ uint32_t load_volatile32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_relaxed_sys32(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.sys.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// ---- Asynchronous copies (cp.async) ----------------------------------------
// An L2 policy for data read once per call (weights): evict first, so it does not
// push data every CTA reads (activations) out of L2.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared with an L2 policy and a 256-byte L2 prefetch.
__device__ __forceinline__ void copy16_async(void* smem, const void* global, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2;" ::"r"(shared_address(smem)),
               "l"(global), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void copy16_async(void* smem, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(smem)), "l"(global) : "memory");
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void copy_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

}  // namespace tpdecode::dev
