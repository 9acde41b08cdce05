// The device-helper layer every kernel uses: programmatic dependent launch (PDL),
// the global timer, fences, asynchronous copies with L2 cache policies, bulk copies
// (TMA) completing on mbarriers, warp-level MMA, and BF16 (bf16.hpp, shared with the
// host). The mailboxes' loads and stores are the memory policy's
// (src/comm/memory.hpp: one class for device and host).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cuda/ptx>

#include "core/bf16.hpp"

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

// Orders this thread's earlier memory operations before its later ones for every
// observer in the system (other GPUs, the host).
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
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
// In a 4-stage ring whose prologue's last group holds chunks 0-2 and whose iteration
// c commits one group (chunk c + 3's) before this wait: chunk c's group has
// min(c + 1, 3) younger ones.
__device__ __forceinline__ void copy_wait_ring4(int c) {
  if (c == 0)
    copy_wait<1>();
  else if (c == 1)
    copy_wait<2>();
  else
    copy_wait<3>();
}

// ---- Bulk copies (TMA) and mbarriers ---------------------------------------
// A bulk copy moves `bytes` (a multiple of 16; both addresses 16-byte aligned)
// from global to this CTA's shared memory and counts them against `bar`'s
// transaction count. A phase of `bar` completes once its expected arrivals came
// and every byte announced with mbar_arrive_expect_tx has landed.
__device__ __forceinline__ void bulk_copy_to_shared(void* smem, const void* global, uint32_t bytes, uint64_t* bar,
                                                    uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          shared_address(smem)),
      "l"(global), "r"(bytes), "r"(shared_address(bar)), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void bulk_copy_to_shared(void* smem, const void* global, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(smem)),
               "l"(global), "r"(bytes), "r"(shared_address(bar))
               : "memory");
}

// One thread initialises; mbar_init_fence() then makes the barriers visible to
// the bulk-copy (async) proxy, and a __syncthreads() to the other threads.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) { cuda::ptx::mbarrier_init(bar, arrivals); }
__device__ __forceinline__ void mbar_init_fence() {
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}
// Why asm volatile (arrive, try_wait): cuda::ptx's versions are plain asm with an
// output, which the compiler may drop (an unused arrival state) or hoist out of a
// polling loop.
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n\t.reg .b64 state;\n\tmbarrier.arrive.shared::cta.b64 state, [%0];\n\t}" ::"r"(shared_address(bar))
               : "memory");
}
// Arrives and announces `bytes` more bytes of bulk copies for the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("{\n\t.reg .b64 state;\n\tmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n\t}" ::"r"(
                   shared_address(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(shared_address(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
// A wait on a barrier in this CTA past this long is a bug (a byte count that does
// not match the copies): the kernel traps instead of hanging the GPU. A sanitizer
// build raises it (-DTPDECODE_MBAR_TIMEOUT_NS=...): racecheck runs a kernel so
// slowly that a correct wait can pass 10 s.
#ifndef TPDECODE_MBAR_TIMEOUT_NS
#define TPDECODE_MBAR_TIMEOUT_NS 10'000'000'000ull
#endif
inline constexpr uint64_t kMbarTimeoutNs = TPDECODE_MBAR_TIMEOUT_NS;
// Waits until the phase of parity `parity` (0 for the barrier's first phase, then
// alternating) has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  if (mbar_try_wait(bar, parity)) return;
  const uint64_t start = global_timer_ns();
  while (!mbar_try_wait(bar, parity))
    if (global_timer_ns() - start > kMbarTimeoutNs) __trap();
}
// mbar_try_wait with acquire at cluster scope: for a barrier whose bytes come from
// other CTAs of the cluster (st.async completes them with release at cluster scope).
__device__ __forceinline__ bool mbar_try_wait_cluster(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(shared_address(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
// mbar_wait for such a barrier (the same deadline and trap).
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, uint32_t parity) {
  if (mbar_try_wait_cluster(bar, parity)) return;
  const uint64_t start = global_timer_ns();
  while (!mbar_try_wait_cluster(bar, parity))
    if (global_timer_ns() - start > kMbarTimeoutNs) __trap();
}

// A cluster barrier arrival that orders nothing: a release arrival is a
// MEMBAR.ALL.GPU, which waits for every outstanding global store of the thread
// (its outputs, NVLink pushes). The clobber keeps the compiler from moving memory
// operations across it.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

// A barrier over `threads` threads (a multiple of 32) of the CTA; id 0 is __syncthreads.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- Streaming loads ----------------------------------------------------------
// 16 bytes read once (weights): through the non-coherent path, allocating nothing in
// L1 and asking L2 for the whole 256-byte sector group (the next lanes' and steps'
// bytes). The memory must not be written while the kernel runs.
__device__ __forceinline__ uint4 load_once16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// ---- Warp-level matrix multiply (mma.sync, ldmatrix) --------------------------
__device__ __forceinline__ uint4 load_shared16(const void* p) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(shared_address(p)));
  return v;
}
// Four 8x8 BF16 matrices from shared memory: lane l gives the address of row l % 8
// of matrix l / 8; register j receives row (lane / 4), columns 2 (lane % 4) + {0, 1}
// of matrix j.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address)
               : "memory");
}
// d += a * b, m16n8k16, BF16 in, FP32 accumulate (a: row-major 16x16, b: 16x8).
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
// d += one 16-byte piece of W rows g and g + 8 times the same 8 columns of token g
// (g = lane / 4): two m16n8k16 MMAs whose K order is a permutation of the columns,
// the same for A and B, so the dot products are the plain ones. Lane (g, t = lane %
// 4) holds columns c .. c + 7 at c = 32 i + 8 t of a 32-column group i; MMA h takes
// its columns 4 h + {0, 1} as logical k 2t, 2t+1 and 4 h + {2, 3} as 2t+8, 2t+9, so
// the 4 lanes of a row fill logical k 0-15 from 16 distinct columns. No ldmatrix and
// no shuffles: each lane multiplies the bytes it loaded.
__device__ __forceinline__ void mma_bf16_piece(float (&d)[4], const uint4& row_g, const uint4& row_g8,
                                               const uint4& token_g) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
    mma_bf16(d, word(row_g, 2 * h), word(row_g8, 2 * h), word(row_g, 2 * h + 1), word(row_g8, 2 * h + 1),
             word(token_g, 2 * h), word(token_g, 2 * h + 1));
}

}  // namespace tpdecode::dev
