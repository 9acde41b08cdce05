// The GEMM program's kernel: one CTA per SM runs every op of the program in order,
// with the wgmma engine's tiles (gemm/wgmma_tiles.cuh) at one 64-row sub-tile and
// kDepth chunks per ring stage. Weights are packed at build (pack_weight: each K
// step of a block one contiguous, pre-swizzled 8 KB x kDepth run; a [64, 64] box
// of the row-major weight streamed 81 % where the packed runs stream 87-92 %) and
// arrive as one bulk copy per stage. The weight producer streams its units'
// weights across op boundaries, waiting for nothing but free stages and, with
// kInFlightBytes in flight, an earlier stage's arrival (kernel_shape: why); the
// activation loaders (program_activations.cuh) fill x into the stages, by copies
// or, while the op x comes from is not known complete, by polling its mailbox. So
// the next op's weights are in flight while the previous op finishes, as far as
// the ring holds them, and only the math waits for the data it needs.
//
// Ordering: an op that others read publishes each block into the mailbox (32-bit
// words that start empty, so each shows its own arrival) and then counts the block
// in op_done: relaxed, the readers' copies checked word by word (a GPU-scope release
// waits for the SM's weight stream in flight; at up to kRelaxedCountRows rows), or
// with release (more rows, where the copies find more words not yet published and
// poll them, and where another op stores over what its CTAs wrote in place:
// counts_released).
// Parts of a split block meet in scratch slots that start empty (a NaN pattern):
// the finisher warps (program_finisher.cuh) sum parts 1 .. parts-1 in order while
// the consumers still multiply part 0, the consumers add part 0 to that sum, and
// the finisher counts the blocks, so no wait on global memory stalls the
// consumers. Nothing needs a host reset: the finisher empties the slots it read;
// run r publishes into mailbox epoch r % 2 and empties the other one (which run
// r + 1 publishes into); the last CTA to finish resets the counts and advances the
// epoch.
#include <cuda/atomic>
#include <cuda_bf16.h>

#include <algorithm>
#include <limits>

#include "core/silu_mul.cuh"
#include "gemm/gemm_tactic.hpp"
#include "gemm/wgmma_tiles.cuh"
#include "program/program_activations.cuh"
#include "program/program_finisher.cuh"
#include "program/program_fold.cuh"
#include "program/program_launch.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::program {
namespace {

using wgmma::kConsumerThreads;
using Atomic = cuda::atomic_ref<uint32_t, cuda::thread_scope_device>;

// This run's and this CTA's timeline entries (Args::timeline; after
// griddepcontrol.wait: the run's slot comes from the epoch count).
__device__ __forceinline__ uint64_t* cta_timeline(const Args& a) {
  const uint32_t slot = Atomic(*a.counters.epoch).load(cuda::memory_order_relaxed) % 8;
  return a.timeline + (static_cast<uint64_t>(slot) * gridDim.x + blockIdx.x) * (1 + kTimelineFields * a.op_count);
}

// This CTA's units as the weight producer and the consumers walk them.
template <int kDepth>
struct CtaSchedule {
  CtaUnits units;
  // Where a timeline is recorded, the producer's waits per op (its fourth and
  // fifth fields), summed over the op's units. Its entries are found at the first
  // record: the producer streams before griddepcontrol.wait, and waits for it there.
  mutable uint64_t* timeline = nullptr;
  __device__ bool times_waits() const { return units.a->timeline != nullptr; }
  __device__ void waited(int i, uint64_t free_ns, uint64_t cap_ns) const {
    if (timeline == nullptr) {
      dev::pdl_wait();
      timeline = cta_timeline(*units.a);
    }
    const int op = units[i].op;
    uint64_t* e = timeline + 1 + kTimelineFields * op + 3;
    const bool first = units.opens_op(i);
    e[0] = first ? free_ns : e[0] + free_ns;
    e[1] = first ? cap_ns : e[1] + cap_ns;
  }
  __device__ int count() const { return units.count(); }
  __device__ wgmma::Unit unit(int i) const {
    const Unit& u = units[i];
    return {static_cast<int64_t>(u.block) * kBlockRows, u.step_begin, u.step_end};
  }
  static constexpr uint32_t kStepBytes = static_cast<uint32_t>(kDepth) * wgmma::kTileBytes;
  // Step `step` of unit i: one bulk copy of its packed tiles (pack_weight).
  __device__ void load_weights(int i, int step, uint8_t* smem, uint64_t* bar, uint64_t policy) const {
    const Unit& u = units[i];
    const OpDesc& op = units.a->ops[u.op];
    const uint8_t* packed = static_cast<const uint8_t*>(op.packed) +
                            (static_cast<int64_t>(u.block) * op.steps + step) * static_cast<int64_t>(kStepBytes);
    dev::bulk_copy_to_shared(smem, packed, kStepBytes, bar, policy);
  }
};

__device__ __forceinline__ uint32_t bf16_bits(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// The BF16 outputs a consumer thread holds of a block, register by register: the
// rounded sums, or (kSiluMul) per gate register i (fragment row r < 8 of its warp's
// 16) silu(gate) * up with the up value of register i | 2 (row r + 8), pack_weight's
// gated order. `row(i)` is the out column of register i. A template parameter, not
// a flag, so that the plain epilogue carries no branch of the gated one.
template <int kTokens, bool kSiluMul>
struct BlockOutputs {
  const float (&sum)[kTokens / 2];
  int64_t row0;  // the block's first out column
  int warp, lane;
  __device__ uint32_t bits(int i) const {
    if constexpr (!kSiluMul) {
      return bf16_bits(sum[i]);
    } else {
      const float gate = __bfloat162float(__float2bfloat16_rn(sum[i]));
      const float up = __bfloat162float(__float2bfloat16_rn(sum[i | 2]));
      return __bfloat16_as_ushort(dev::silu_mul(gate, up));
    }
  }
  // Whether register i holds an output (the gated order: its gate rows only).
  __device__ bool holds(int i) const { return !kSiluMul || (i % 4) / 2 == 0; }
  __device__ int64_t row(int i) const {
    return kSiluMul ? row0 + 8 * warp + lane / 4 : row0 + wgmma::fragment_row(warp, lane, i);
  }
};

// The block's outputs into the mailbox, one 32-bit word (two rows of a token) per
// store: a thread holds rows r, tokens t and t + 1 of its fragment pairs, so the
// threads of rows r and r + 1 (lanes 4 apart) trade one value each.
template <int kTokens, bool kSiluMul>
__device__ __forceinline__ void publish(const Args& a, const OpDesc& op, uint32_t epoch,
                                        const BlockOutputs<kTokens, kSiluMul>& o) {
  const bool even = (o.lane / 4) % 2 == 0;  // this thread's rows are even
  uint32_t* box = a.mailbox + epoch * a.epoch_words;
#pragma unroll
  for (int i = 0; i < kTokens / 2; i += 2) {
    if (!o.holds(i)) continue;
    const uint32_t v0 = o.bits(i), v1 = o.bits(i + 1);  // tokens t, t + 1
    const uint32_t got = __shfl_xor_sync(0xffffffffu, even ? v1 : v0, 4);
    uint32_t word = even ? v0 | got << 16 : got | v1 << 16;
    if (word == kEmptyWord) word = 0x7fff7fffu;
    const int token = wgmma::fragment_token(o.lane, i) + (even ? 0 : 1);
    const int64_t row = o.row(i) - (even ? 0 : 1);
    if (token < a.m && row < op.n)
      store_relaxed(box + protocol::mailbox_element(op.out_mailbox, op.out_mailbox_stride, token, row) / 2, word);
  }
}

// The consumer warpgroup after multiply_unit. Parts 1 .. parts-1 of a split block
// store their partials and go on (each value shows its own arrival). Part 0 -- its
// CTA's last unit of the op -- adds its own to the finisher's sum of the others
// (program_finisher.cuh); it and a block of one part store the block and, where an
// op reads it, publish it and hand the count to the finisher.
template <int kTokens>
__device__ __forceinline__ void finish_unit(const Args& a, const Unit& u, uint32_t epoch,
                                            const float (&acc)[kTokens / 2], const Handoff& h, HandoffPhases& ph) {
  constexpr int kRegs = kTokens / 2;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32;
  const OpDesc& op = a.ops[u.op];
  const int64_t row0 = static_cast<int64_t>(u.block) * kBlockRows;
  auto at = [&](int i) { return wgmma::fragment_token(lane, i) * kBlockRows + wgmma::fragment_row(warp, lane, i); };
  if (u.part > 0) {
#pragma unroll
    for (int i = 0; i < kRegs; ++i) {
      const uint32_t v = __float_as_uint(acc[i]);
      const int token = wgmma::fragment_token(lane, i);
      if (token < a.m)
        store_relaxed(reinterpret_cast<uint32_t*>(a.scratch) +
                          protocol::part_element(u.scratch, u.part, a.m, token, wgmma::fragment_row(warp, lane, i)),
                      v == kEmptyPartial ? 0x7fffffffu : v);
    }
    return;
  }
  float sum[kRegs];
#pragma unroll
  for (int i = 0; i < kRegs; ++i) sum[i] = acc[i];
  if (protocol::finisher_sums(u)) {
    dev::mbar_wait(h.pre_full, ph.pre);
#pragma unroll
    for (int i = 0; i < kRegs; ++i)
      if (wgmma::fragment_token(lane, i) < a.m) sum[i] = h.pre[at(i)] + sum[i];
    if (arrives_for_warp(lane)) dev::mbar_arrive(h.pre_empty);
    ph.pre ^= 1;
  }
  if (op.rstd_stats >= 0)  // a folded norm's reader: its rows' rstd (the finisher's prologue)
#pragma unroll
    for (int i = 0; i < kRegs; ++i) {
      const int token = wgmma::fragment_token(lane, i);
      if (token < a.m) sum[i] = __fmul_rn(sum[i], h.rstd[token]);
    }
  auto store = [&](const auto& outputs) {
    auto* out = static_cast<uint16_t*>(op.out);
#pragma unroll
    for (int i = 0; i < kRegs; ++i) {
      if (!outputs.holds(i)) continue;
      const int token = wgmma::fragment_token(lane, i);
      const int64_t row = outputs.row(i);
      if (token < a.m && row < op.n) out[token * op.out_stride + row] = static_cast<uint16_t>(outputs.bits(i));
    }
    if (counted(a, u)) publish(a, op, epoch, outputs);
  };
  if (op.silu_mul != 0) {
    store(BlockOutputs<kTokens, true>{sum, row0 / 2, warp, lane});
  } else if (op.stats < 0) {
    store(BlockOutputs<kTokens, false>{sum, row0, warp, lane});
  } else {  // a folded norm's producer (program_fold.cuh): out, then h published with its row sums
    auto* out = static_cast<uint16_t*>(op.out);
    const uint32_t* box = a.mailbox + epoch * a.epoch_words;
#pragma unroll
    for (int i = 0; i < kRegs; ++i) {
      const int token = wgmma::fragment_token(lane, i);
      const int64_t row = row0 + wgmma::fragment_row(warp, lane, i);
      const bool real = token < a.m && row < op.n;
      const __nv_bfloat16 v = __float2bfloat16_rn(sum[i]);
      if (real) out[token * op.out_stride + row] = __bfloat16_as_ushort(v);
      float hv = __bfloat162float(v);
      if (real && op.residual != nullptr)
        hv = __fadd_rn(hv, __bfloat162float(static_cast<const __nv_bfloat16*>(op.residual)[token * op.residual_stride + row]));
      else if (real && op.residual_mailbox >= 0)
        hv = __fadd_rn(hv, polled_bf16(box, protocol::mailbox_element(op.residual_mailbox, op.residual_mailbox_stride,
                                                                      token, row)));
      sum[i] = real ? __bfloat162float(__float2bfloat16_rn(hv)) : 0.0f;
      if (real && op.residual_out != nullptr)
        static_cast<uint16_t*>(op.residual_out)[token * op.residual_out_stride + row] =
            static_cast<uint16_t>(bf16_bits(sum[i]));
    }
    publish(a, op, epoch, BlockOutputs<kTokens, false>{sum, row0, warp, lane});
    block_sums_of_squares<kTokens>(a, op, epoch, u.block, sum, h.row_sums, ph.row_sums);
  }
  if (!counted(a, u)) return;
  // The warp's stores before its arrival (release at CTA scope; the finisher's
  // release of the count is cumulative over what its wait acquired).
  if (arrives_for_warp(lane)) {
    dev::mbar_wait(h.pub_empty, ph.pub ^ 1);
    dev::mbar_arrive(h.pub_full);
  }
  ph.pub ^= 1;
}

// The consumer warpgroup, before its units: empties this CTA's share of the other
// epoch's mailbox (the previous run's, complete: griddepcontrol.wait returned),
// which the next run publishes into.
__device__ __forceinline__ void empty_other_epoch(const Args& a, uint32_t epoch) {
  const protocol::Range share = protocol::empty_share(a.epoch_words / 4, blockIdx.x, gridDim.x);
  uint4* other = reinterpret_cast<uint4*>(a.mailbox + (epoch ^ 1) * a.epoch_words);
  for (int64_t i = share.begin + threadIdx.x; i < share.end; i += kConsumerThreads)
    other[i] = uint4{kEmptyWord, kEmptyWord, kEmptyWord, kEmptyWord};
}

// Accumulator chains of the consumers (wgmma_tiles.cuh: kChains): 2 at 64 tokens.
// Why: the kernel's 12 warps cap a thread at 168 registers, and 4 chains of 32
// accumulators spilled 368 bytes there; an m64n64k16 is long enough that 2 chains
// keep the tensor cores busy on the stream's 16 KB a stage. Its own summation order
// (chains over k16 steps 0 + 2 and 1 + 3), other bits than the 32-token kernel's.
template <int kTokens>
inline constexpr int kProgramChains = kTokens >= 64 ? 2 : wgmma::kChains;

__device__ __forceinline__ uint32_t read_epoch(const Args& a) {
  return protocol::publish_epoch(Atomic(*a.counters.epoch).load(cuda::memory_order_relaxed));
}

// kTeam: a TeamProgram's rank with team ops (Args::team_ops); a kernel of its own so
// that the team's sum stays out of the other programs' registers (NormShare).
template <int kTokens, int kDepth, bool kTeam>
__global__ void __launch_bounds__(kProgramThreads, 1) gemm_program_kernel(const __grid_constant__ Args a) {
  // Why at entry: a next kernel may launch and prefetch its weights during this
  // one's tail; it reads this kernel's outputs only after griddepcontrol.wait.
  dev::pdl_launch_dependents();
  using Ring = wgmma::Ring<wgmma::kTileRows, kTokens, kDepth>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + wgmma::kAlign - 1) &
                                             ~uintptr_t{wgmma::kAlign - 1});
  auto* bars = reinterpret_cast<uint64_t*>(base + a.stages * Ring::kStageBytes);
  const Ring ring{base, a.stages, bars, bars + a.stages};
  uint64_t* landed = bars + 2 * a.stages;  // a stage's weights are in (kernel_shape: why a cap)
  uint64_t* x_landed = landed + a.stages;  // a stage's checked copy of x is in
  // The loader warps polling a stage now (the weight producer's lower cap meanwhile).
  int* polling = reinterpret_cast<int*>(x_landed + a.stages);
  uint64_t* handoff_bars = x_landed + a.stages + 2;  // `pre` 16-byte aligned
  float* pre = reinterpret_cast<float*>(handoff_bars + kHandoffBarriers);
  const Handoff handoff{pre,
                        handoff_bars,
                        handoff_bars + 1,
                        handoff_bars + 2,
                        handoff_bars + 3,
                        handoff_bars + 4,
                        handoff_bars + 5,
                        pre + kTokens * kBlockRows,
                        pre + kTokens * kBlockRows + kTokens};
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < a.stages) {
    dev::mbar_init(ring.full + tid, 1);  // the activation loader, once the weights are in
    dev::mbar_init(landed + tid, 1);     // the weight producer's copy
    dev::mbar_init(x_landed + tid, 1);   // the activation loader
    dev::mbar_init(ring.empty + tid, wgmma::kConsumerWarps);
  }
  if (tid == 0) {
    *polling = 0;
    dev::mbar_init(handoff.pre_full, summing_warps(a.m) * kArrivalsPerWarp);
    dev::mbar_init(handoff.pre_empty, wgmma::kConsumerWarps * kArrivalsPerWarp);
    dev::mbar_init(handoff.pub_full, wgmma::kConsumerWarps * kArrivalsPerWarp);
    dev::mbar_init(handoff.pub_empty, 1);
    dev::mbar_init(handoff.prologue_full, 1);
    dev::mbar_init(handoff.prologue_empty, wgmma::kConsumerWarps * kArrivalsPerWarp);
  }
  if (tid < a.stages) dev::mbar_init_fence();
  // The x tiles' rows past m: zero for good (copies write them as zeros, the polled
  // loads leave them).
  for (int s = 0; s < a.stages; ++s)
    for (int i = tid; i < Ring::kXBytes / 16; i += blockDim.x)
      reinterpret_cast<uint4*>(ring.x(s))[i] = uint4{0, 0, 0, 0};
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const CtaUnits units{&a, a.cta_begin[blockIdx.x], a.cta_begin[blockIdx.x + 1]};
  const int warp = tid / 32;
  if (warp == wgmma::kWeightWarp) {
    wgmma::Cursor cur;
    if (tid % 32 == 0)
      wgmma::produce_weights(ring, CtaSchedule<kDepth>{units}, cur,
                             {landed, a.inflight_stages, polling, a.polling_inflight_stages});
    return;
  }
  // The program's inputs, the previous run's mailbox, scratch and counters: the
  // previous kernel's.
  dev::pdl_wait();
  if (warp > wgmma::kWeightWarp && warp < kFinisherWarp) {
    if (units.count() > 0)
      ActivationLoader<kTokens, kDepth>{
          a, units, ring, landed, x_landed, polling, read_epoch(a), warp - wgmma::kWeightWarp - 1, tid % 32}
          .run();
    return;
  }
  if (warp >= kFinisherWarp) {
    Finisher<kTeam>{a, units, handoff, tid - 32 * kFinisherWarp}.run(read_epoch(a));
    // The last CTA to finish resets the counts and advances the epoch for the next
    // run: every count of this CTA is the counting thread's (which arrives here),
    // and the consumers' reads of the epoch and the loaders' waits (before the
    // consumers' last MMAs) precede the barrier.
    dev::named_barrier_sync(kFinishBarrier, kConsumerThreads + kFinisherThreads);
    if (tid == 32 * kFinisherWarp) {
      Atomic done(*a.counters.ctas_done);
      if (protocol::last_to_finish(done.fetch_add(1, cuda::memory_order_acq_rel), gridDim.x)) {
        for (int o = 0; o < a.op_count; ++o) Atomic(a.counters.op_done[o]).store(0, cuda::memory_order_relaxed);
        done.store(0, cuda::memory_order_relaxed);
        Atomic runs(*a.counters.epoch);
        runs.store(runs.load(cuda::memory_order_relaxed) + 1, cuda::memory_order_relaxed);
      }
      // The team mailbox's epoch: after every finisher thread's last read of it
      // (the barrier above).
      if constexpr (kTeam) {
        lamport::Memory mem(a.team.timeout_ns);
        team::end_run(mem, a.team, a.team_box, gridDim.x);
      }
    }
    return;
  }
  const uint32_t epoch = read_epoch(a);
  empty_other_epoch(a, epoch);
  const CtaSchedule<kDepth> schedule{units};
  wgmma::Cursor cur;
  HandoffPhases phases;
  float acc[kProgramChains<kTokens>][1][kTokens / 2];
  uint64_t* timeline = nullptr;  // this run's and this CTA's entries, where recorded
  if (a.timeline != nullptr) {
    timeline = cta_timeline(a);
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    if (tid == 0) timeline[0] = sm;
  }
  for (int j = 0; j < units.count(); ++j) {
    // Where a timeline is recorded: this unit's op entry, if it is the CTA's first
    // (start) or last (ends) unit of the op.
    uint64_t* first = nullptr;
    uint64_t* last = nullptr;
    if (timeline != nullptr) {
      const int op = units[j].op;
      if (units.opens_op(j)) first = timeline + 1 + kTimelineFields * op;
      if (units.closes_op(j)) last = timeline + 2 + kTimelineFields * op;
    }
    if (first != nullptr) {
      dev::mbar_wait(ring.full + cur.stage, cur.parity);  // multiply_unit's first wait, earlier
      if (tid == 0) *first = dev::global_timer_ns();
    }
    wgmma::multiply_unit(ring, schedule.unit(j), cur, acc);
    if (last != nullptr && tid == 0) last[0] = dev::global_timer_ns();
    const int op = units[j].op;
    const bool prologue = has_prologue(a.ops[op]);
    if (prologue && units.opens_op(j)) dev::mbar_wait(handoff.prologue_full, phases.prologue);
    finish_unit<kTokens>(a, units[j], epoch, acc[0][0], handoff, phases);
    if (prologue && units.closes_op(j)) {
      if (arrives_for_warp(tid % 32)) dev::mbar_arrive(handoff.prologue_empty);  // after the warp's reads of rstd
      phases.prologue ^= 1;
    }
    if (last != nullptr && tid == 0) last[1] = dev::global_timer_ns();
  }
  dev::named_barrier_sync(kFinishBarrier, kConsumerThreads + kFinisherThreads);
}

// One 16-byte piece of the packed weight per thread: tile (block, step, d) holds
// rows block * 64 .. + 63 (gated: program_launch.hpp's order) and columns (step *
// depth + d) * 64 .. + 63 (zeros past the weight), its row r's piece j at r * 128 +
// (j ^ r % 8) * 16: the 128-byte swizzle a tensor-map box would have written.
__global__ void pack_weight_kernel(const uint4* __restrict__ w, int64_t n, int64_t k, int64_t steps, int depth,
                                   bool gated, const uint4* __restrict__ scale, uint4* __restrict__ packed,
                                   int64_t pieces) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < pieces;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(e % 8), r = static_cast<int>((e / 8) % kBlockRows);
    const int64_t tile = e / (8 * kBlockRows);  // (block * steps + step) * depth + d
    const int64_t chunk = tile % (steps * depth);
    const int64_t block = tile / (steps * depth);
    const int64_t col = chunk * 64 + j * 8;
    int64_t row = block * kBlockRows + r;
    bool real = row < n;
    if (gated) {
      const int64_t gate = block * (kBlockRows / 2) + 8 * (r / 16) + r % 8;
      real = gate < n / 2;
      row = r % 16 < 8 ? gate : n / 2 + gate;
    }
    uint4 v = real && col < k ? w[(row * k + col) / 8] : uint4{0, 0, 0, 0};
    if (scale != nullptr && real && col < k) {
      float f[8], g[8];
      unpack8(v, f);
      unpack8(scale[col / 8], g);
#pragma unroll
      for (int i = 0; i < 8; ++i) f[i] = __fmul_rn(f[i], g[i]);
      v = pack8(f);
    }
    packed[tile * (8 * kBlockRows) + r * 8 + (j ^ (r % 8))] = v;
  }
}

// The kernels built: (tokens, depth) of kernel_shape, with or without team ops;
// f(kernel, its threads).
template <bool kTeam, class F>
bool with_kernel(int tokens, int depth, F&& f) {
  if (tokens == 8 && depth == 4) return f(gemm_program_kernel<8, 4, kTeam>, kProgramThreads), true;
  if (tokens == 16 && depth == 2) return f(gemm_program_kernel<16, 2, kTeam>, kProgramThreads), true;
  if (tokens == 32 && depth == 2) return f(gemm_program_kernel<32, 2, kTeam>, kProgramThreads), true;
  if (tokens == 64 && depth == 2) return f(gemm_program_kernel<64, 2, kTeam>, kProgramThreads), true;
  return false;
}
template <class F>
bool with_kernel(int tokens, int depth, bool team, F&& f) {
  return team ? with_kernel<true>(tokens, depth, f) : with_kernel<false>(tokens, depth, f);
}

}  // namespace

KernelShape kernel_shape(int m) {
  KernelShape s;
  s.tokens = wgmma::token_tile(m);
  // Why 4 chunks per step at 8 tokens: one 32 KB weight copy per stage (16 KB
  // stages measured 2-4 % slower at 1-4 rows); from 16 tokens 16 KB stages (the
  // ring twice as deep) measured 5-7 % faster at 16 rows (docs/performance.md).
  s.depth = s.tokens <= 8 ? 4 : 2;
  // Shared memory: the aligned ring, its barriers and the finisher's handoff.
  const int stage = s.depth * (wgmma::kTileBytes + s.tokens * wgmma::kChunkK * 2);
  const int handoff = kHandoffBarriers * 8 + handoff_floats(s.tokens) * 4;
  // The ring's full, empty, landed and x_landed barriers, the polling count (16 bytes).
  auto bytes = [&](int stages) { return stages * stage + (4 * stages + 2) * 8 + handoff + wgmma::kAlign; };
  s.stages = 0;
  while (s.stages < wgmma::kMaxStages && bytes(s.stages + 1) <= kSmemPerCtaMax) ++s.stages;
  s.smem_bytes = bytes(s.stages);
  // Why a cap on the weight bytes in flight: every global-memory wait of the
  // program (partials, the mailbox) queues behind the whole GPU's outstanding
  // reads; with the other SMs streaming a flag took 0.5-1.7 us one way at 64 KB in
  // flight per SM and 3.7-5.7 us at 192 KB, and 64 KB still streams at the read
  // ceiling. The chains ran 4-6 % faster at 1 and 8 rows, 2 % at 16 (32 KB
  // starved the stream; docs/performance.md).
  s.inflight_stages = std::clamp(kInFlightBytes / (s.depth * wgmma::kTileBytes), 1, s.stages);
  // Why fewer while a loader polls: the polls queue behind the weights in flight
  // (one 32 KB stage in flight throughout measured 2-2.5 % faster at TP 8 and 5 %
  // slower at TP 4 M 1, where the stream starved; docs/performance.md), and the
  // loaders poll only in the first stages after an op boundary.
  s.polling_inflight_stages = std::clamp(kPollingInFlightBytes / (s.depth * wgmma::kTileBytes), 1, s.inflight_stages);
  return s;
}

void prepare_program_kernels() {
  for (int tokens : {8, 16, 32, 64}) {
    const KernelShape s = kernel_shape(tokens);
    for (bool team : {false, true})
      with_kernel(s.tokens, s.depth, team, [&](auto kernel, int) {
        TPD_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, s.smem_bytes));
      });
  }
}

int resident_ctas_per_sm(const KernelShape& s) {
  int fewest = std::numeric_limits<int>::max();
  for (bool team : {false, true}) {
    const bool built = with_kernel(s.tokens, s.depth, team, [&](auto kernel, int threads) {
      int blocks = 0;
      TPD_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, s.smem_bytes));
      fewest = std::min(fewest, blocks);
    });
    if (!built) return 0;  // no kernel of this shape: it fits nowhere
  }
  return fewest;
}

int64_t packed_rows(int64_t n, bool gated) {
  constexpr int64_t kGateRows = kBlockRows / 2;
  return gated ? (n / 2 + kGateRows - 1) / kGateRows * kBlockRows : (n + kBlockRows - 1) / kBlockRows * kBlockRows;
}

int64_t packed_bytes(int64_t n, int64_t k, int depth, bool gated) {
  return packed_rows(n, gated) / kBlockRows * steps_of({n, k}, depth) * depth * wgmma::kTileBytes;
}

void pack_weight(const void* w, int64_t n, int64_t k, int depth, bool gated, const void* scale, void* packed,
                 cudaStream_t stream) {
  const int64_t pieces = packed_bytes(n, k, depth, gated) / 16;
  const int64_t blocks = std::min<int64_t>((pieces + 255) / 256, 65535);
  pack_weight_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(static_cast<const uint4*>(w), n, k,
                                                                        steps_of({n, k}, depth), depth, gated,
                                                                        static_cast<const uint4*>(scale),
                                                                        static_cast<uint4*>(packed), pieces);
  TPD_CUDA(cudaGetLastError());
}

void launch_program(const Args& a, const KernelShape& s, int grid, bool pdl, cudaStream_t stream) {
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(static_cast<unsigned>(grid));
  c.dynamicSmemBytes = static_cast<std::size_t>(s.smem_bytes);
  c.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  c.attrs = attr;
  c.numAttrs = pdl ? 1 : 0;
  const bool built = with_kernel(s.tokens, s.depth, a.team_ops != 0, [&](auto kernel, int threads) {
    c.blockDim = dim3(static_cast<unsigned>(threads));
    TPD_CUDA(cudaLaunchKernelEx(&c, kernel, a));
  });
  if (!built) throw InvalidArgument("gemm program: no kernel for this row count");
}

}  // namespace tpdecode::program
