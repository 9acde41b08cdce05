// The GEMM program's activation loaders: warps that fill every ring stage's x
// ([depth][tokens][64] bf16 in the 128-byte swizzle wgmma reads; tokens past m and
// columns past k zero) and arrive on the stage's full barrier once its weights are
// in (the kernel's `landed` barriers), in one of two ways:
//  - a tensor-map copy (TMA): for an input of the program, and for a window of an
//    earlier op's outputs once that op's completion counter is seen complete
//    (acquire, then fence.proxy.async.global: the copies read what the count
//    covers). Deep: a stage's copy is issued as soon as the stage is free.
//  - polled loads: while that counter is short, the warp loads the stage's x from
//    the op's mailbox with relaxed loads; every 32-bit word starts empty
//    (kEmptyWord) and shows its own arrival, so each value is taken as soon as it
//    is published, without waiting for the release of the count (which waits for
//    the weight stream in flight on the writer's SM).
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
  int* polling;      // the loader warps polling now (the weight producer's cap is lower meanwhile)
  uint32_t epoch;
  int warp;  // of the loaders
  int lane;

  // The polled path: the m real rows of the stage's x, 16-byte piece p of the stage
  // at chunk d = p / (8 m), token t, piece q of its 128 bytes.
  __device__ void poll_stage(const Position& at, const OpDesc& op) const {
    const uint16_t* box = reinterpret_cast<const uint16_t*>(a.mailbox + epoch * a.epoch_words);
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
        const int64_t col = (static_cast<int64_t>(at.step) * kDepth + d) * wgmma::kChunkK + q * 8;
        src[j] = p < pieces && col < op.k ? box + protocol::mailbox_element(op.x_mailbox, op.x_stride, t, col)
                                          : nullptr;
        offset[j] = p < pieces ? d * Ring::kXChunkBytes + t * 128 + ((q ^ (t % 8)) * 16) : -1;
        v[j] = src[j] != nullptr ? load_relaxed16(src[j]) : uint4{0, 0, 0, 0};
      }
      poll_until_published(v, [&](int j) { return src[j] != nullptr; }, [&](int j) { return src[j]; });
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (offset[j] >= 0) *reinterpret_cast<uint4*>(x + offset[j]) = v[j];
    }
    // The generic-proxy stores before wgmma's (async-proxy) reads of the stage.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncwarp();
    if (lane == 0) {
      dev::mbar_wait(landed + at.cur.stage, at.cur.parity);
      dev::mbar_arrive(ring.full + at.cur.stage);
    }
  }

  // Whether op `after`'s outputs are all published and ordered before this warp's
  // copies (lane 0 asks; the answer for the whole warp).
  __device__ bool complete(int after) const {
    int done = 0;
    if (lane == 0) {
      const OpDesc& from = a.ops[after];
      if (protocol::complete(cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(a.counters.op_done[after])
                                 .load(cuda::memory_order_acquire),
                             from.blocks)) {
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
    while (!at.done(units)) {
      const OpDesc& op = a.ops[units[at.unit].op];
      if (units[at.unit].op != op_index) {
        op_index = units[at.unit].op;
        copies = op.after < 0;
        if (lane == 0)
          asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&op.x_map[epoch])) : "memory");
      }
      if (!copies) copies = complete(op.after);
      dev::mbar_wait(ring.empty + at.cur.stage, at.cur.parity ^ 1);
      if (copies) {
        if (lane == 0) {
          dev::mbar_wait(landed + at.cur.stage, at.cur.parity);
          dev::mbar_arrive_expect_tx(ring.full + at.cur.stage, Ring::kXBytes);
          wgmma::load_step<kDepth>(ring.x(at.cur.stage), &op.x_map[epoch], at.step, 0, ring.full + at.cur.stage,
                                   policy);
        }
      } else {
        if (lane == 0) atomicAdd(polling, 1);
        poll_stage(at, op);
        if (lane == 0) atomicSub(polling, 1);
      }
      for (int w = 0; w < kLoaderWarps; ++w) at.next(units, ring.stages);
    }
  }
};

}  // namespace tpdecode::program
