// The Lamport mailbox protocol, written once for two drivers: the GPU kernels and
// CPU threads (the protocol tests). Every function here is a template over a
// Memory policy (memory.hpp: PTX on the device, std::atomic_ref on the host, the
// same poll cadence on both), so the CPU tests run the code the kernels run.
//
// Slots are 32-bit words armed with kSentinel (as a BF16 pair: +0 low, -0 high). A
// 16-byte fragment is published once none of its words is the sentinel: checked per
// word, so 16-byte stores need not be atomic. A data word equal to the sentinel is
// sent as 0 (clean): no consumer can tell -0 from +0.
//
// Epochs. Every mailbox has, in each rank's control block, an epoch counter. A call
// reads it on entry and uses parity = epoch % parities; the last CTA of the call to
// arrive advances it (next_epoch: modulo a multiple of the parities). The counter
// lives on the device, so any number of calls per CUDA graph, replayed back to back
// any number of times, alternates parities: no caller ever passes one.
//
// Reuse safety. Uses u, u+1, u+2 ... of one mailbox go to parities 0, 1, 0 ... (two
// parities). A rank r re-arms its slots of use u after reading them. A peer p
// pushes use u+2 into r's parity only after p finished use u+1, which needed r's
// push of u+1, which r made after its re-arm of u. So r's re-arm of u precedes p's
// push of u+2, and no push is overwritten or read stale. Two orderings must hold at
// system scope for that chain:
//  (1) r's re-arm of use u is visible before r's pushes of use u+1 reach a peer:
//      the kernel boundary between the two calls on r's stream (a grid completes
//      with its stores performed; with programmatic dependent launch the next grid
//      stores into a mailbox only after griddepcontrol.wait, which waits for that
//      completion). A kernel that re-arms a mailbox and later pushes into the same
//      mailbox in one launch would need a fence.acq_rel.sys per CTA between the
//      two; none does.
//  (2) p's observation of r's push (a volatile poll of p's own memory) precedes p's
//      later pushes: the kernel boundary again.
// Three parities serve callers that re-arm a use lazily, one use later (the reader
// of use u re-arms it during use u+1): then u+3 is the first reuse.
//
// Failure. Every poll is bounded: past its deadline a thread records the error
// (rank, op, parity, slot) and sets the team's abort word in every rank's control
// block. Polls check their own abort word every kCheckEvery polls, and every call
// checks it on entry: once set, every rank's calls do nothing but poison their
// outputs (quiet NaN) and report, until a collective reset. Hence no stale data: a
// late push of use u can only land in a rank that has stopped consuming.
#pragma once

#include <cstdint>

#include "comm/memory.hpp"
#include "core/bf16.hpp"

namespace tpdecode::lamport {

inline constexpr uint32_t kSentinel = 0x80000000u;
inline constexpr int kMaxRanks = 16;
// Epoch counters in a control block (16 bytes each): a mailbox per TpComm (3), per
// TeamProgram (1), per OprojMailbox; room for a program per layer of a deep model.
inline constexpr int kMaxMailboxes = 255;

TPD_HD constexpr uint32_t clean(uint32_t word) { return word == kSentinel ? 0u : word; }
TPD_HD constexpr Fragment clean(Fragment f) {
  return Fragment{{clean(f.w[0]), clean(f.w[1]), clean(f.w[2]), clean(f.w[3])}};
}
TPD_HD constexpr bool published(const Fragment& f) {
  return f.w[0] != kSentinel && f.w[1] != kSentinel && f.w[2] != kSentinel && f.w[3] != kSentinel;
}
TPD_HD constexpr Fragment armed() { return Fragment{{kSentinel, kSentinel, kSentinel, kSentinel}}; }
TPD_HD constexpr Fragment poisoned() {
  constexpr uint32_t nan2 = static_cast<uint32_t>(bf16::kQuietNaN) * 0x10001u;
  return Fragment{{nan2, nan2, nan2, nan2}};
}

// One rank's control block (symmetric memory, zero-filled at build and on reset):
// the team's abort word (0, or 1 + the rank that timed out; written by any rank)
// and one epoch counter per mailbox (written only by the owner's calls).
struct alignas(16) EpochCounter {
  uint32_t epoch;
  uint32_t arrivals;  // CTAs of the current call that have read `epoch`
  uint32_t pad[2];
};
struct alignas(16) ControlBlock {
  uint32_t abort;
  uint32_t pad[3];
  EpochCounter mailbox[kMaxMailboxes];
};

// Which collective a poll belonged to (recorded on timeout).
enum class Op : int32_t {
  kNone = 0,
  kAllReduce,
  kArNorm,
  kGather,
  kTwoShotReduce,
  kTwoShotGather,
  kOproj,
  kTest,
  kProgram,
};

// The record a failed call leaves for the host, one per rank in host-mapped
// memory. Written once, by the first failing thread of the rank: flag 0 -> 2 by
// compare-and-swap, the fields, a system fence, then flag 1.
struct ErrorRecord {
  uint32_t flag;    // 0: none; 2: being written; 1: complete
  int32_t kind;     // ErrorKind
  int32_t rank;     // the rank that failed
  int32_t op;       // Op
  int32_t parity;
  int32_t slot;     // timeout: the slot (writer rank) that never published; abort: the rank that aborted
  int32_t row;
  int32_t column;
};
enum class ErrorKind : int32_t { kTimeout = 1, kAborted = 2 };

// What a call needs to know about its team, per rank (a kernel parameter).
struct TeamRef {
  ControlBlock* control[kMaxRanks];  // every rank's control block
  ControlBlock* own;                 // control[rank]: why apart, an entry without an indexed parameter load
  ErrorRecord* error;                // this rank's record
  uint64_t timeout_ns;
  int rank;
  int size;
};

// One mailbox, as a rank's call sees it: [parities, slots, rows_cap, row_bytes] in
// every rank's memory.
struct MailboxRef {
  char* base[kMaxRanks];
  long parity_bytes;  // slots * rows_cap * row_bytes
  long row_bytes;
  int rows_cap;
  int parities;
  int index;  // its epoch counter in the control block
};

// One call of one op on one rank, after entry.
struct Call {
  Op op;
  int parity;
};

TPD_HD Fragment* slot_fragment(const MailboxRef& box, int owner, int parity, int slot, int row, int frag) {
  char* p = box.base[owner] + parity * box.parity_bytes + (static_cast<long>(slot) * box.rows_cap + row) * box.row_bytes;
  return reinterpret_cast<Fragment*>(p) + frag;
}

template <class Memory>
TPD_HD void record_error(Memory& mem, const TeamRef& team, ErrorKind kind, Op op, int parity, int slot, int row,
                         int column) {
  ErrorRecord* e = team.error;
  if (!mem.cas_word(&e->flag, 0u, 2u)) return;  // the rank's first failure is kept
  e->kind = static_cast<int32_t>(kind);
  e->rank = team.rank;
  e->op = static_cast<int32_t>(op);
  e->parity = parity;
  e->slot = slot;
  e->row = row;
  e->column = column;
  mem.fence_system();
  mem.store_word(&e->flag, 1u);
}

// A timed-out poll: record it and abort the team (every rank's abort word).
template <class Memory>
TPD_HD void time_out(Memory& mem, const TeamRef& team, const Call& call, int slot, int row, int column) {
  record_error(mem, team, ErrorKind::kTimeout, call.op, call.parity, slot, row, column);
  for (int r = 0; r < team.size; ++r) mem.store_word(&team.control[r]->abort, static_cast<uint32_t>(team.rank + 1));
}

// A call that found the team aborted (on entry or in a poll): record it.
template <class Memory>
TPD_HD void note_abort(Memory& mem, const TeamRef& team, Op op, int parity, uint32_t abort_word, int row, int column) {
  record_error(mem, team, ErrorKind::kAborted, op, parity, static_cast<int>(abort_word) - 1, row, column);
}

inline constexpr uint32_t kAbortedEntry = 0xffffffffu;

// Entry of one CTA of a call, in three parts so that the atomic stays off the
// critical path:
//  begin(): the abort word and the epoch in one round trip: the parity to use, or
//    kAbortedEntry (nothing may be touched; the caller poisons its outputs).
//  take_ticket(): the CTA's arrival (an atomic increment), once per CTA by its thread
//    0 (on the device only lane 0 of a warp arrives: Memory::arrive), after a
//    CTA-wide barrier that follows every begin() of the CTA (two forms: thread 0
//    reads and publishes the parity through shared memory and a barrier, the
//    two-shot kernels; or every thread reads it itself and the ticket waits for
//    the row sum's first barrier, row_collective.cuh). Its result is not waited
//    for until advance_if_last(), at the end of the thread's work.
//  advance_if_last(): the CTA that arrived last resets the count and advances the
//    epoch.
// Why no CTA can read the advanced epoch: a CTA arrives only after its epoch loads
// have returned (each value was used, then a barrier passed before the ticket is
// taken), and the last CTA's stores are issued only once its ticket has returned
// the count of all the others (they depend on its value).
// The next call reads the advanced epoch after the kernel boundary (griddepcontrol
// .wait under PDL), as everything else in the reuse argument.
// report false: an abort seen is not recorded here (the caller records it once for
// several readers: row_collective.cuh, where every thread enters).
template <class Memory>
TPD_HD uint32_t begin(Memory& mem, const TeamRef& team, const MailboxRef& box, Op op, uint32_t* epoch,
                      bool report = true) {
  const uint32_t abort = mem.load_word(&team.own->abort);
  *epoch = mem.load_word(&team.own->mailbox[box.index].epoch);
  if (abort != 0) {
    if (report) note_abort(mem, team, op, -1, abort, -1, -1);
    return kAbortedEntry;
  }
  // Why the test: a division by a run-time divisor is ~20 dependent instructions
  // between the entry's load and the first push.
  return box.parities == 2 ? *epoch & 1u : *epoch % static_cast<uint32_t>(box.parities);
}

template <class Memory>
TPD_HD uint32_t take_ticket(Memory& mem, const TeamRef& team, const MailboxRef& box) {
  return mem.arrive(&team.own->mailbox[box.index].arrivals);
}

// The epoch after `epoch`: epochs count modulo the largest multiple of `parities`
// a 32-bit counter holds, so the parities go on in turn across the wrap. Why: with
// three parities a plain 32-bit counter wraps from parity 0 (2^32 - 1) to parity 0,
// one use after another in the same slots, as with one parity; 2^32 calls of one
// mailbox are days of a serving process at tens of thousands of calls a second.
TPD_HD constexpr uint32_t next_epoch(uint32_t epoch, int parities) {
  if (parities == 2) return epoch + 1;  // 2^32 is a multiple of 2
  const uint64_t period = (uint64_t{1} << 32) / static_cast<uint64_t>(parities) * static_cast<uint64_t>(parities);
  return uint64_t{epoch} + 1 == period ? 0u : epoch + 1;
}

template <class Memory>
TPD_HD void advance_if_last(Memory& mem, const TeamRef& team, const MailboxRef& box, uint32_t epoch, uint32_t ticket,
                            unsigned ctas) {
  if (ticket + 1 != ctas) return;
  EpochCounter& c = team.own->mailbox[box.index];
  mem.store_word(&c.arrivals, 0u);
  mem.store_word(&c.epoch, next_epoch(epoch, box.parities));
}

// The three parts at once (callers with nothing to overlap).
template <class Memory>
TPD_HD uint32_t enter(Memory& mem, const TeamRef& team, const MailboxRef& box, Op op, unsigned ctas) {
  uint32_t epoch = 0;
  const uint32_t parity = begin(mem, team, box, op, &epoch);
  if (parity != kAbortedEntry) advance_if_last(mem, team, box, epoch, take_ticket(mem, team, box), ctas);
  return parity;
}

enum class Poll : int { kDone = 0, kTimedOut, kAborted };

// Waits until every slot_of(s), s < kSlots (the caller's own memory), is published
// and copies it to raw[s]. On kTimedOut, *first_missing is the first slot that
// never arrived; on kAborted, it is the abort word.
template <int kSlots, class Memory, class SlotOf>
TPD_HD Poll wait_all(Memory& mem, SlotOf slot_of, Fragment (&raw)[kSlots], const ControlBlock* own,
                     uint32_t* first_missing) {
  static_assert(kSlots <= 32, "pending mask is 32 bits");
  uint32_t pending = kSlots == 32 ? ~0u : (1u << kSlots) - 1u;
  while (true) {
    // Why every slot's load before any test: one round then costs one memory round
    // trip, not one per pending slot (testing slot s before issuing slot s+1's load
    // made each load wait for the previous one's value; a load under a per-slot
    // predicate is interleaved the same way once the slots outnumber the
    // predicate registers). Re-reading a published slot returns what it held:
    // nothing writes it before this call's re-arm (the reuse argument above).
TPD_UNROLL
    for (int s = 0; s < kSlots; ++s) raw[s] = mem.poll(slot_of(s));
    pending = 0;
TPD_UNROLL
    for (int s = 0; s < kSlots; ++s)
      if (!published(raw[s])) pending |= 1u << s;
    if (pending == 0) return Poll::kDone;
    switch (mem.check(&own->abort)) {
      case PollCheck::kContinue:
        break;
      case PollCheck::kAborted:
        *first_missing = mem.load_word(&own->abort);
        return Poll::kAborted;
      case PollCheck::kExpired:
        for (int s = 0; s < kSlots; ++s)
          if (pending & (1u << s)) {
            *first_missing = static_cast<uint32_t>(s);
            break;
          }
        return Poll::kTimedOut;
    }
  }
}

// Push: the caller's fragment, cleaned, to its slot in every rank's mailbox
// (slot_of(peer) is the address in peer's copy): the peer-store transport, one
// store per peer (a multicast store would be the other implementation).
template <int kRanks, class Memory, class SlotOf>
TPD_HD void push_to_all(Memory& mem, SlotOf slot_of, Fragment mine) {
  const Fragment sent = clean(mine);
TPD_UNROLL
  for (int peer = 0; peer < kRanks; ++peer) mem.push(slot_of(peer), sent);
}

// Re-arm: the reader writes the sentinel back into its own slots after use.
template <int kSlots, class Memory, class SlotOf>
TPD_HD void rearm(Memory& mem, SlotOf slot_of) {
TPD_UNROLL
  for (int s = 0; s < kSlots; ++s) mem.push(slot_of(s), armed());
}

// The all-reduce contract on one fragment: FP32 sums in rank order 0..kSlots-1
// (starting from slot 0's value), rounded once to BF16.
template <int kSlots>
TPD_HD Fragment sum_rank_order(const Fragment (&raw)[kSlots]) {
  Fragment out;
TPD_UNROLL
  for (int j = 0; j < 4; ++j) {
    float lo = bf16::low_of(raw[0].w[j]);
    float hi = bf16::high_of(raw[0].w[j]);
TPD_UNROLL
    for (int s = 1; s < kSlots; ++s) {
      lo += bf16::low_of(raw[s].w[j]);
      hi += bf16::high_of(raw[s].w[j]);
    }
    out.w[j] = bf16::pack_rounded(lo, hi);
  }
  return out;
}

// Leaves a failed poll: records the timeout (and aborts the team) or the abort.
template <class Memory>
TPD_HD void report_poll(Memory& mem, const TeamRef& team, const Call& call, Poll result, uint32_t missing, int row,
                        int column) {
  if (result == Poll::kTimedOut)
    time_out(mem, team, call, static_cast<int>(missing), row, column);
  else
    note_abort(mem, team, call.op, call.parity, missing, row, column);
}

}  // namespace tpdecode::lamport
