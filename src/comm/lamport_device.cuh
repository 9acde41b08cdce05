// The GPU driver of the Lamport protocol (lamport_protocol.hpp): the memory
// instructions, the bounded poll, the timeout record, and programmatic dependent
// launch (PDL) controls.
#pragma once

#include <cuda_runtime.h>

#include "comm/lamport_protocol.hpp"
#include "tpdecode/mailbox_error.hpp"

namespace tpdecode::lamport {

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// PDL: let the next kernel in the stream launch now (its pre-wait prologue, e.g.
// weight prefetch, overlaps this kernel) ...
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
// ... and wait until the previous kernel completed and its stores are visible.
// No mailbox store may precede this (reuse-safety ordering (1) and (2)).
__device__ __forceinline__ void wait_prerequisites() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Memory policy of the GPU: volatile 16-byte polls of own memory, system-scope
// relaxed 16-byte stores to peers, and a deadline read off %globaltimer every 64
// polls (the timer read costs more than a poll of an L2-resident line).
struct DeviceMemory {
  uint64_t deadline_ns;
  uint32_t polls = 0;

  __device__ __forceinline__ explicit DeviceMemory(uint64_t timeout_ns) : deadline_ns(global_timer_ns() + timeout_ns) {}

  __device__ __forceinline__ Fragment load(const Fragment* p) {
    Fragment f;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(f.w[0]), "=r"(f.w[1]), "=r"(f.w[2]), "=r"(f.w[3])
                 : "l"(p)
                 : "memory");
    return f;
  }
  __device__ __forceinline__ void store(Fragment* p, Fragment f) {
    asm volatile("st.relaxed.sys.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(f.w[0]), "r"(f.w[1]),
                 "r"(f.w[2]), "r"(f.w[3])
                 : "memory");
  }
  __device__ __forceinline__ bool expired() {
    if ((++polls & 63u) != 0) return false;
    return global_timer_ns() > deadline_ns;
  }
};

// Plain 16-byte global load / store of data (not mailbox) fragments.
__device__ __forceinline__ Fragment load_fragment(const void* p) { return *static_cast<const Fragment*>(p); }
__device__ __forceinline__ void store_fragment(void* p, Fragment f) { *static_cast<Fragment*>(p) = f; }

// The first thread of this rank to miss its deadline fills the record; later ones
// leave it. Fields are stored before the flag, with a system-scope fence between.
__device__ __forceinline__ void record_timeout(MailboxError* e, int rank, CommOp op, int parity, int slot, int row,
                                               int column) {
  if (atomicCAS(&e->flag, 0u, 2u) != 0u) return;
  e->rank = rank;
  e->op = static_cast<int32_t>(op);
  e->parity = parity;
  e->slot = slot;
  e->row = row;
  e->column = column;
  __threadfence_system();
  atomicExch(&e->flag, 1u);
}

// Address of fragment `frag` of row `row` in slot `slot` of a mailbox copy laid out
// [slots, rows_cap, row_bytes].
__device__ __forceinline__ Fragment* slot_fragment(void* base, int slot, int rows_cap, long row_bytes, int row,
                                                   int frag) {
  char* p = static_cast<char*>(base) + (static_cast<long>(slot) * rows_cap + row) * row_bytes;
  return reinterpret_cast<Fragment*>(p) + frag;
}

}  // namespace tpdecode::lamport
