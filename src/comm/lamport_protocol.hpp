// The Lamport mailbox protocol, written once for two drivers: the GPU kernels
// (lamport_device.cuh: PTX loads and stores) and CPU threads (the protocol tests:
// std::atomic_ref). A Memory policy supplies load / store of one 16-byte fragment
// and the deadline:
//   Fragment load(const Fragment*);   // a poll of the caller's own memory
//   void store(Fragment*, Fragment);   // a push to a peer, or a re-arm of own memory
//   bool expired();                    // the poll deadline has passed
//
// Slots are 32-bit words armed with kSentinel (as a BF16 pair: +0 low, -0 high).
// A fragment (4 words) is published once none of its words is the sentinel: checked
// per word, so 16-byte stores need not be atomic. A data word equal to the sentinel
// is sent as 0 (clean): no consumer can tell -0 from +0.
//
// Reuse safety (parity). Every call site alternates between two mailboxes, A and B
// (uses u, u+1, u+2 ... go to A, B, A ...). A rank r re-arms its slots of use u
// after reading them. A peer p pushes use u+2 into r's A only after p finished use
// u+1, which needed r's push of u+1 into p's B, which r made after its re-arm of u.
// So r's re-arm of u precedes p's push of u+2 and no push is overwritten or read
// stale. Two orderings must hold at system scope for that chain:
//  (1) r's re-arm of use u is visible before r's pushes of use u+1 reach a peer:
//      the kernel boundary between the two calls on r's stream (a grid completes
//      with its stores performed; with programmatic dependent launch the next grid
//      stores into a mailbox only after griddepcontrol.wait, which waits for that
//      completion). A kernel that re-arms a mailbox and later pushes into the
//      same mailbox in one launch would need a fence.acq_rel.sys per CTA between
//      the two; no kernel here does that.
//  (2) p's observation of r's push (a volatile poll of p's own memory) precedes p's
//      later pushes: the kernel boundary again (p's next mailbox store is in a later
//      grid, after griddepcontrol.wait).
// Nobody ever writes a peer's slot except the slot's one writer; nobody clears a
// peer's memory. The two-shot MoE tail uses three parities for the same reason
// with one more hop.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TPD_HD __host__ __device__ __forceinline__
#define TPD_UNROLL _Pragma("unroll")
#else
#define TPD_HD inline
#define TPD_UNROLL
#endif

namespace tpdecode::lamport {

inline constexpr uint32_t kSentinel = 0x80000000u;

struct alignas(16) Fragment {
  uint32_t w[4];
};

TPD_HD constexpr uint32_t clean(uint32_t word) { return word == kSentinel ? 0u : word; }

TPD_HD constexpr Fragment clean(Fragment f) {
  return Fragment{{clean(f.w[0]), clean(f.w[1]), clean(f.w[2]), clean(f.w[3])}};
}

TPD_HD constexpr bool published(const Fragment& f) {
  return f.w[0] != kSentinel && f.w[1] != kSentinel && f.w[2] != kSentinel && f.w[3] != kSentinel;
}

TPD_HD constexpr Fragment armed() { return Fragment{{kSentinel, kSentinel, kSentinel, kSentinel}}; }

// Push: the caller's fragment, cleaned, to its slot in every rank's mailbox
// (slot_of(peer) is the address in peer's copy). One store per peer: the
// peer-store transport (a multicast store would be the other implementation).
template <int kRanks, class Memory, class SlotOf>
TPD_HD void push_to_all(Memory& mem, SlotOf slot_of, Fragment mine) {
  const Fragment sent = clean(mine);
TPD_UNROLL
  for (int peer = 0; peer < kRanks; ++peer) mem.store(slot_of(peer), sent);
}

// Poll: waits until every slot_of(s), s < kSlots (the caller's own memory), is
// published and copies it to raw[s]. Returns -1, or on deadline the first slot
// that never arrived.
template <int kSlots, class Memory, class SlotOf>
TPD_HD int wait_all(Memory& mem, SlotOf slot_of, Fragment (&raw)[kSlots]) {
  static_assert(kSlots <= 32, "pending mask is 32 bits");
  uint32_t pending = kSlots == 32 ? ~0u : (1u << kSlots) - 1u;
  while (true) {
TPD_UNROLL
    for (int s = 0; s < kSlots; ++s) {
      if (pending & (1u << s)) {
        raw[s] = mem.load(slot_of(s));
        if (published(raw[s])) pending &= ~(1u << s);
      }
    }
    if (pending == 0) return -1;
    if (mem.expired()) {
      for (int s = 0; s < kSlots; ++s)
        if (pending & (1u << s)) return s;
    }
  }
}

// Re-arm: the reader writes the sentinel back into its own slots after use.
template <int kSlots, class Memory, class SlotOf>
TPD_HD void rearm(Memory& mem, SlotOf slot_of) {
TPD_UNROLL
  for (int s = 0; s < kSlots; ++s) mem.store(slot_of(s), armed());
}

// BF16 pair <-> FP32, by bits (identical on host and device).
TPD_HD float low_of(uint32_t word) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(word << 16);
#else
  return __builtin_bit_cast(float, word << 16);
#endif
}
TPD_HD float high_of(uint32_t word) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(word & 0xffff0000u);
#else
  return __builtin_bit_cast(float, word & 0xffff0000u);
#endif
}

// FP32 -> BF16 bits, round to nearest even (NaN stays a quiet NaN).
TPD_HD uint32_t round_bf16(float f) {
#if defined(__CUDA_ARCH__)
  uint32_t u = __float_as_uint(f);
#else
  uint32_t u = __builtin_bit_cast(uint32_t, f);
#endif
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

TPD_HD uint32_t pack_bf16(float lo, float hi) { return round_bf16(lo) | (round_bf16(hi) << 16); }

// The all-reduce contract on one fragment: FP32 sums in rank order 0..kSlots-1
// (starting from slot 0's value), rounded once to BF16. values[] receives the
// eight FP32 sums before rounding.
template <int kSlots>
TPD_HD Fragment sum_rank_order(const Fragment (&raw)[kSlots]) {
  Fragment out;
TPD_UNROLL
  for (int j = 0; j < 4; ++j) {
    float lo = low_of(raw[0].w[j]);
    float hi = high_of(raw[0].w[j]);
TPD_UNROLL
    for (int s = 1; s < kSlots; ++s) {
      lo += low_of(raw[s].w[j]);
      hi += high_of(raw[s].w[j]);
    }
    out.w[j] = pack_bf16(lo, hi);
  }
  return out;
}

}  // namespace tpdecode::lamport
