// The GEMM program's activation loaders: warps that fill every ring stage's x
// ([depth][tokens][64] bf16 in the 128-byte swizzle wgmma reads; tokens past m and
// columns past k zero) and arrive on the stage's full barrier once its weights are
// in (the kernel's `landed` barriers), in one of three ways:
//  - a tensor-map copy (TMA) onto the full barrier: for an input of the program,
//    and for a window of an earlier op's outputs once that op's count, released
//    (OpDesc::count_release), is seen complete (acquire, then
//    fence.proxy.async.global: the copies read what the count covers). Deep: a
//    stage's copy is issued as soon as the stage is free.
//  - a checked copy: where the earlier op counts relaxed (a release waits for the
//    weight stream in flight on the writer's SM), once its count is seen complete
//    the copy lands on the stage's x_landed barrier and the warp checks its words:
//    every 32-bit word of the mailbox starts empty (kEmptyWord) and shows its own
//    arrival, so a copy brings each word either empty, polled then until
//    published, or as published.
//  - polled loads: while that count is short, the warp loads the stage's x from the
//    op's mailbox with relaxed loads, each value taken as soon as it is published.
// The first stages after an op boundary are polled; the later ones run on copies.
//
// kLoaderWarps warps take the stages in turn (warp w positions w, w + warps, ...),
// so that after an op boundary that many stages are polled at once.
#pragma once

#include <cuda/atomic>

#include <cstdint>

#include "gemm/wgmma_tiles.cuh"
#include "program/program_launch.hpp"
#include "program/program_protocol.hpp"

namespace tpdecode::program {

// A mailbox word no op has published (two BF16 NaNs of a pattern the epilogue
// never stores: it stores a word equal to it as 0x7fff7fff, NaNs too).
inline constexpr uint32_t kEmptyWord = 0xffffffffu;

__device__ __forceinline__ uint4 load_relaxed16(const void* p) {
  uint4 v;
  asm volatile("ld.relaxed.gpu.global.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ void store_relaxed16(void* p, uint4 v) {
  asm volatile("st.relaxed.gpu.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void store_relaxed(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ bool has_empty(const uint4& v) {
  return v.x == kEmptyWord || v.y == kEmptyWord || v.z == kEmptyWord || v.w == kEmptyWord;
}

// Loads again every piece j of v that is `live(j)` and still holds an empty word,
// from at(j), until none does: one L2 round trip a round. A bug's bound: traps after
// kMbarTimeoutNs (the loaders' and the finisher's polls).
template <int kBatch, class Live, class At>
__device__ __forceinline__ void poll_until_published(uint4 (&v)[kBatch], Live&& live, At&& at) {
  uint64_t start = 0;
  for (;;) {
    bool empty = false;
#pragma unroll
    for (int j = 0; j < kBatch; ++j) empty |= live(j) && has_empty(v[j]);
    if (!empty) return;
    if (start == 0) start = dev::global_timer_ns();
    else if (dev::global_timer_ns() - start > dev::kMbarTimeoutNs) __trap();
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (live(j) && has_empty(v[j])) v[j] = load_relaxed16(at(j));
  }
}

// Whether op `op` counts its blocks with release (its readers acquire the count) or
// relaxed (their copies checked).
__device__ __forceinline__ bool counts_released(const Args& a, int op) {
  return a.ops[op].count_release != 0 || !protocol::relaxed_counts(a.m);
}

// The units of one CTA's share of the plan.
struct CtaUnits {
  const Args* a;
  int begin;
  int end;
  __device__ int count() const { return end - begin; }
  __device__ const Unit& operator[](int i) const { return a->units[begin + i]; }
  // Whether unit i is the CTA's first / last unit of its op.
  __device__ bool opens_op(int i) const { return i == 0 || (*this)[i - 1].op != (*this)[i].op; }
  __device__ bool closes_op(int i) const { return i + 1 == count() || (*this)[i + 1].op != (*this)[i].op; }
};

// A walk over a CTA's ring positions: unit i's K step `step`, at the ring's cursor.
struct Position {
  int unit = 0;
  int step = 0;
  wgmma::Cursor cur;
  __device__ Position(const CtaUnits& units) {
    if (units.count() > 0) step = units[0].step_begin;
  }
  __device__ bool done(const CtaUnits& units) const { return unit >= units.count(); }
  __device__ void next(const CtaUnits& units, int stages) {
    if (done(units)) return;
    cur.next(stages);
    if (++step == units[unit].step_end && ++unit < units.count()) step = units[unit].step_begin;
  }
};

// The loader warps. 3: registers are allocated per quarter of the SM, a warp in
// four to each, so the kernel's 12 warps (program_finisher.cuh) cap a thread at 168
// registers, which the kernels fit; a fourth loader would make 13, 128 registers.
inline constexpr int kLoaderWarps = 3;

template <int kTokens, int kDepth>
struct ActivationLoader {
  using Ring = wgmma::Ring<wgmma::kTileRows, kTokens, kDepth>;
  // 16-byte pieces a lane holds per round of polled loads. 4: more polls in flight
  // ran slower (8: TP 8 M 1 +5 %, M 28 +8 %; 16: +45 %), as did two stages polled
  // at once (docs/performance.md).
  static constexpr int kBatch = 4;

  const Args& a;
  const CtaUnits& units;
  const Ring& ring;
  uint64_t* landed;  // per stage: its weights are in (the kernel's cap on them in flight)
  uint64_t* x_landed;  // per stage: a checked copy's x is in
  int* polling;      // the loader warps polling now (the weight producer's cap is lower meanwhile)
  uint32_t epoch;
  int warp;  // of the loaders
  int lane;

  // This run's mailbox, as BF16 elements.
  __device__ const uint16_t* mailbox() const {
    return reinterpret_cast<const uint16_t*>(a.mailbox + epoch * a.epoch_words);
  }
  // Where in `box` (mailbox()) 16-byte piece `piece` of token `token`'s 128 bytes in
  // chunk `chunk` of the stage at `at` is published; nullptr past k (where the stage
  // holds zeros).
  __device__ const uint16_t* published_at(const uint16_t* box, const Position& at, const OpDesc& op, int chunk,
                                          int token, int piece) const {
    const int64_t col = (static_cast<int64_t>(at.step) * kDepth + chunk) * wgmma::kChunkK + piece * 8;
    return col < op.k ? box + protocol::mailbox_element(op.x_mailbox, op.x_stride, token, col) : nullptr;
  }

  // The m real rows of the stage's x polled from the mailbox: 16-byte piece p of the
  // stage at chunk d = p / (8 m), token t, piece q of its 128 bytes.
  __device__ void fill_stage(const Position& at, const OpDesc& op) const {
    const uint16_t* box = mailbox();
    const int pieces = kDepth * a.m * 8;
    uint8_t* x = ring.x(at.cur.stage);
    for (int first = 0; first < pieces; first += 32 * kBatch) {
      uint4 v[kBatch];
      const uint16_t* src[kBatch];
      int offset[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int p = first + j * 32 + lane;
        const int d = p / (8 * a.m), t = (p / 8) % a.m, q = p % 8;
        src[j] = p < pieces ? published_at(box, at, op, d, t, q) : nullptr;
        offset[j] = p < pieces ? protocol::x_piece_offset(Ring::kXChunkBytes, d, t, q) : -1;
        v[j] = src[j] == nullptr ? uint4{0, 0, 0, 0} : load_relaxed16(src[j]);
      }
      poll_until_published(v, [&](int j) { return src[j] != nullptr; }, [&](int j) { return src[j]; });
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (offset[j] >= 0) *reinterpret_cast<uint4*>(x + offset[j]) = v[j];
    }
    hand_over(at);
  }

  // A checked copy's x: every 16-byte piece of the m real rows read in shared memory
  // (protocol::copy_piece: a lane's pieces are bits of `stale`); only a piece that
  // holds an empty word (the copy overtook its store) is loaded from the mailbox
  // until published and stored back, so that a piece found published costs a
  // shared-memory load and a compare. Why: walking the pieces as the polls do, a
  // mailbox address each, the TP 8 chain ran 24 / 58 / 171 us slower at M 8 / 16 / 28
  // (docs/performance.md, "Chains").
  __device__ void check_copy(const Position& at, const OpDesc& op) const {
    constexpr int kPieces = kDepth * protocol::copy_rows_per_lane(kTokens);
    static_assert(kPieces <= 32, "a lane's pieces are bits of one word");
    uint8_t* x = ring.x(at.cur.stage);
    auto offset = [&](const protocol::CopyPiece& c) {
      return protocol::x_piece_offset(Ring::kXChunkBytes, c.chunk, c.token, c.piece);
    };
    uint32_t stale = 0;
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      const protocol::CopyPiece c = protocol::copy_piece(kTokens, lane, i);
      if (c.token < a.m && has_empty(*reinterpret_cast<const uint4*>(x + offset(c)))) stale |= 1u << i;
    }
    const uint16_t* box = mailbox();
    while (stale != 0) {
      uint4 v[kBatch];
      const uint16_t* src[kBatch];
      protocol::CopyPiece c[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int i = __ffs(stale) - 1;  // -1: none left
        stale &= stale - 1;
        c[j] = protocol::copy_piece(kTokens, lane, i < 0 ? 0 : i);
        src[j] = i >= 0 ? published_at(box, at, op, c[j].chunk, c[j].token, c[j].piece) : nullptr;
        v[j] = src[j] == nullptr ? uint4{0, 0, 0, 0} : load_relaxed16(src[j]);
      }
      poll_until_published(v, [&](int j) { return src[j] != nullptr; }, [&](int j) { return src[j]; });
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (src[j] != nullptr) *reinterpret_cast<uint4*>(x + offset(c[j])) = v[j];
    }
    hand_over(at);
  }

  // A stage's x once polled or checked: the generic-proxy stores before wgmma's
  // (async-proxy) reads of the stage, then its full barrier once its weights are in.
  __device__ void hand_over(const Position& at) const {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncwarp();
    if (lane == 0) {
      dev::mbar_wait(landed + at.cur.stage, at.cur.parity);
      dev::mbar_arrive(ring.full + at.cur.stage);
    }
  }

  // Whether op `after`'s outputs are all published: where it counts with release,
  // ordered before this warp's copies too (lane 0 asks; the answer for the whole warp).
  __device__ bool complete(int after) const {
    int done = 0;
    if (lane == 0) {
      const OpDesc& from = a.ops[after];
      cuda::atomic_ref<uint32_t, cuda::thread_scope_device> count(a.counters.op_done[after]);
      if (!counts_released(a, after)) {
        done = protocol::complete(count.load(cuda::memory_order_relaxed), from.blocks);
      } else if (protocol::complete(count.load(cuda::memory_order_acquire), from.blocks)) {
        asm volatile("fence.proxy.async.global;" ::: "memory");
        done = 1;
      }
    }
    return __shfl_sync(0xffffffffu, done, 0) != 0;
  }

  // This warp's stages of the CTA's units, in ring order.
  __device__ void run() const {
    // Why evict-last: every row block of a weight reads these activations again.
    const uint64_t policy = dev::evict_last_policy();
    Position at(units);
    for (int w = 0; w < warp; ++w) at.next(units, ring.stages);
    int op_index = -1;
    bool copies = false;  // this op's x may come by tensor-map copies
    bool checked = false;  // and those copies are checked (its producer counts relaxed)
    while (!at.done(units)) {
      const OpDesc& op = a.ops[units[at.unit].op];
      if (units[at.unit].op != op_index) {
        op_index = units[at.unit].op;
        copies = op.after < 0;
        checked = op.after >= 0 && !counts_released(a, op.after);
#ifdef TPDECODE_TEST_EARLY_COPIES
        copies = copies || checked;  // tests: checked copies from the op's start, so that they find words empty
#endif
        if (lane == 0)
          asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&op.x_map[epoch])) : "memory");
      }
      if (!copies) copies = complete(op.after);
      const int s = at.cur.stage;
      dev::mbar_wait(ring.empty + s, at.cur.parity ^ 1);
      // Every use of a stage completes a phase of its x_landed barrier (one arrival),
      // so that its parity is the ring's.
      if (copies && checked) {
        if (lane == 0) {
          dev::mbar_arrive_expect_tx(x_landed + s, Ring::kXBytes);
          wgmma::load_step<kDepth>(ring.x(s), &op.x_map[epoch], at.step, 0, x_landed + s, policy);
        }
        dev::mbar_wait(x_landed + s, at.cur.parity);
        check_copy(at, op);
      } else if (copies) {
        if (lane == 0) {
          dev::mbar_arrive(x_landed + s);
          dev::mbar_wait(landed + s, at.cur.parity);
          dev::mbar_arrive_expect_tx(ring.full + s, Ring::kXBytes);
          wgmma::load_step<kDepth>(ring.x(s), &op.x_map[epoch], at.step, 0, ring.full + s, policy);
        }
      } else {
        if (lane == 0) atomicAdd(polling, 1);
        fill_stage(at, op);
        if (lane == 0) {
          atomicSub(polling, 1);
          dev::mbar_arrive(x_landed + s);
        }
      }
      for (int w = 0; w < kLoaderWarps; ++w) at.next(units, ring.stages);
    }
  }
};

}  // namespace tpdecode::program
