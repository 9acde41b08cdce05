// The GEMM program's kernel: one CTA per SM runs every op of the program in order,
// with the wgmma engine's tiles (gemm/wgmma_tiles.cuh) at one 64-row sub-tile and
// kDepth chunks per ring stage. Weights are packed at build (pack_weight: each K
// step of a block one contiguous, pre-swizzled 8 KB x kDepth run; a [64, 64] box
// of the row-major weight streamed 81 % where the packed runs stream 87-92 %) and
// arrive as one bulk copy per stage; x comes through its tensor map. The weight
// producer streams its units' weights across op boundaries, waiting for nothing but
// free stages; only the activation producer waits, before an op's first x box, for
// the op it reads to be complete (its completion counter at the op's block count).
// So the next op's weights are in flight while the previous op finishes, as far as
// the ring holds them.
//
// Ordering: a block's outputs are stored by the consumers, then (bar.sync) one
// thread adds to op_done with release at GPU scope; the activation producer polls
// with acquire and then orders its later tensor-map (async-proxy) loads after that
// with fence.proxy.async.global. Parts of a split block meet in scratch slots that
// start empty (a NaN pattern): part 0 polls the others' values and sums every part
// in order 0 .. parts-1 (finish_unit). Nothing needs a host reset: part 0 empties
// the slots it read; the last CTA to finish resets the op counters.
#include <cuda/atomic>
#include <cuda_bf16.h>

#include <algorithm>

#include "gemm/gemm_tactic.hpp"
#include "gemm/wgmma_tiles.cuh"
#include "program/program_launch.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::program {
namespace {

using wgmma::kConsumerThreads;
using wgmma::kThreads;
using Atomic = cuda::atomic_ref<uint32_t, cuda::thread_scope_device>;

// A bounded wait for a completion counter (a bug past the deadline: trap, as
// mbar_wait does).
__device__ __forceinline__ void wait_count(uint32_t* counter, uint32_t target) {
  Atomic c(*counter);
  if (c.load(cuda::memory_order_acquire) >= target) return;
  const uint64_t start = dev::global_timer_ns();
  while (c.load(cuda::memory_order_acquire) < target)
    if (dev::global_timer_ns() - start > dev::kMbarTimeoutNs) __trap();
}

// This CTA's units of the plan.
template <int kDepth>
struct CtaSchedule {
  const Args* a;
  int begin;
  int end;
  __device__ int count() const { return end - begin; }
  __device__ const Unit& plan_unit(int i) const { return a->units[begin + i]; }
  __device__ wgmma::Unit unit(int i) const {
    const Unit& u = plan_unit(i);
    return {static_cast<int64_t>(u.block) * kBlockRows, u.step_begin, u.step_end};
  }
  static constexpr uint32_t kStepBytes = static_cast<uint32_t>(kDepth) * wgmma::kTileBytes;
  __device__ const uint8_t* packed_step(int i, int step) const {
    const Unit& u = plan_unit(i);
    const OpDesc& op = a->ops[u.op];
    return static_cast<const uint8_t*>(op.packed) +
           (static_cast<int64_t>(u.block) * op.steps + step) * static_cast<int64_t>(kStepBytes);
  }
  // Step `step` of unit i: one bulk copy of its packed tiles (pack_weight).
  __device__ void load_weights(int i, int step, uint8_t* smem, uint64_t* bar, uint64_t policy) const {
    dev::bulk_copy_to_shared(smem, packed_step(i, step), kStepBytes, bar, policy);
  }
  __device__ const CUtensorMap* activation_map(int i) const { return &a->ops[plan_unit(i).op].x; }
  // Unit i's x is the outputs of op `after`: every block of it stored.
  __device__ void await_inputs(int i) const {
    const int after = a->ops[plan_unit(i).op].after;
    if (after < 0) return;
    wait_count(a->counters.op_done + after, static_cast<uint32_t>(a->ops[after].blocks));
    asm volatile("fence.proxy.async.global;" ::: "memory");
  }
};

// A partial-sum slot no part has written: a NaN no arithmetic produces (the
// hardware's NaNs are 0x7fffffff), so the value itself says it has arrived.
inline constexpr uint32_t kEmptyPartial = 0xffffffffu;

__device__ __forceinline__ uint32_t load_partial(const float* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Polls the partial at p until written (bounded: a bug past the deadline traps).
__device__ __forceinline__ uint32_t await_partial(const float* p) {
  const uint64_t start = dev::global_timer_ns();
  uint32_t v;
  while ((v = load_partial(p)) == kEmptyPartial)
    if (dev::global_timer_ns() - start > dev::kMbarTimeoutNs) __trap();
  return v;
}

// The consumer warpgroup after multiply_unit. A block of one part: its outputs
// stored. A split block: parts 1 .. parts-1 store their partials and go on (no
// fence, no counter: each value shows its own arrival); part 0 -- its CTA's last
// unit of the op, so the others' are in by then -- adds them in order 1, 2, ... to
// its own, empties their slots for the next run, stores the block. Then the op's
// completion counted (release: the next op's tensor-map loads read these outputs).
template <int kTokens>
__device__ __forceinline__ void finish_unit(const Args& a, const Unit& u, const float (&acc)[kTokens / 2]) {
  constexpr int kRegs = kTokens / 2;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32;
  const OpDesc& op = a.ops[u.op];
  const int64_t row0 = static_cast<int64_t>(u.block) * kBlockRows;
  const int slot = a.m * kBlockRows;  // floats of one part
  float* parts = a.scratch + u.scratch;
  auto at = [&](int p, int i) {
    return parts + p * slot + wgmma::fragment_token(lane, i) * kBlockRows + wgmma::fragment_row(warp, lane, i);
  };
  if (u.part > 0) {
#pragma unroll
    for (int i = 0; i < kRegs; ++i)
      if (wgmma::fragment_token(lane, i) < a.m) __stcg(at(u.part, i), acc[i]);
    return;
  }
  float sum[kRegs];
#pragma unroll
  for (int i = 0; i < kRegs; ++i) sum[i] = acc[i];
  for (int p = 1; p < u.parts; ++p) {
    // Every load of the part first, then the polls of any still empty. Why: a poll
    // per value waits one L2 round trip each, (parts - 1) x tokens / 2 of them.
    uint32_t v[kRegs];
#pragma unroll
    for (int i = 0; i < kRegs; ++i) v[i] = wgmma::fragment_token(lane, i) < a.m ? load_partial(at(p, i)) : 0u;
#pragma unroll
    for (int i = 0; i < kRegs; ++i)
      if (v[i] == kEmptyPartial) v[i] = await_partial(at(p, i));
#pragma unroll
    for (int i = 0; i < kRegs; ++i) {
      sum[i] += __uint_as_float(v[i]);
      if (wgmma::fragment_token(lane, i) < a.m) __stcg(reinterpret_cast<uint32_t*>(at(p, i)), kEmptyPartial);
    }
  }
  auto* out = static_cast<__nv_bfloat16*>(op.out);
#pragma unroll
  for (int i = 0; i < kRegs; ++i) {
    const int token = wgmma::fragment_token(lane, i);
    const int64_t row = row0 + wgmma::fragment_row(warp, lane, i);
    if (token < a.m && row < op.n) out[token * op.out_stride + row] = __float2bfloat16_rn(sum[i]);
  }
  // Every thread's stores of the block before the count.
  dev::named_barrier_sync(wgmma::kEpilogueBarrier, kConsumerThreads);
  if (tid == 0) Atomic(a.counters.op_done[u.op]).fetch_add(1, cuda::memory_order_release);
}

template <int kTokens, int kDepth>
__global__ void __launch_bounds__(kThreads, 1) gemm_program_kernel(const __grid_constant__ Args a) {
  // Why at entry: a next kernel may launch and prefetch its weights during this
  // one's tail; it reads this kernel's outputs only after griddepcontrol.wait.
  dev::pdl_launch_dependents();
  using Ring = wgmma::Ring<1, kTokens, kDepth>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + wgmma::kAlign - 1) &
                                             ~uintptr_t{wgmma::kAlign - 1});
  auto* bars = reinterpret_cast<uint64_t*>(base + a.stages * Ring::kStageBytes);
  const Ring ring{base, a.stages, bars, bars + a.stages};
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < a.stages) {
    dev::mbar_init(ring.full + tid, 2);
    dev::mbar_init(ring.empty + tid, wgmma::kConsumerWarps);
    dev::mbar_init_fence();
  }
  __syncthreads();
  const CtaSchedule<kDepth> schedule{&a, a.cta_begin[blockIdx.x], a.cta_begin[blockIdx.x + 1]};
  const int warp = tid / 32;
  wgmma::Cursor cur;
  if (warp == wgmma::kWeightWarp) {
    if (tid % 32 == 0) wgmma::produce_weights(ring, schedule, cur);
    return;
  }
  if (warp == wgmma::kActivationWarp) {
    if (tid % 32 == 0) {
      dev::pdl_wait();  // the program's inputs and outputs: the previous kernel's
      wgmma::produce_activations(ring, schedule, cur);
    }
    return;
  }
  dev::pdl_wait();
  float acc[wgmma::kChains][1][kTokens / 2];
  for (int j = 0; j < schedule.count(); ++j) {
    const Unit& u = schedule.plan_unit(j);
    wgmma::multiply_unit(ring, schedule.unit(j), cur, acc);
    finish_unit<kTokens>(a, u, acc[0][0]);
  }
  // The last CTA to finish resets the op counters for the next run: every CTA's
  // counts and waits precede its arrival here.
  if (tid == 0) {
    Atomic done(*a.counters.ctas_done);
    if (done.fetch_add(1, cuda::memory_order_acq_rel) == gridDim.x - 1) {
      for (int o = 0; o < a.op_count; ++o) Atomic(a.counters.op_done[o]).store(0, cuda::memory_order_relaxed);
      done.store(0, cuda::memory_order_relaxed);
    }
  }
}

// One 16-byte piece of the packed weight per thread: tile (block, step, d) holds
// rows block * 64 .. + 63 and columns (step * depth + d) * 64 .. + 63 (zeros past the
// weight), its row r's piece j at r * 128 + (j ^ r % 8) * 16: the 128-byte swizzle
// a tensor-map box would have written.
__global__ void pack_weight_kernel(const uint4* __restrict__ w, int64_t n, int64_t k, int64_t steps, int depth,
                                   uint4* __restrict__ packed, int64_t pieces) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < pieces;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(e % 8), r = static_cast<int>((e / 8) % kBlockRows);
    const int64_t tile = e / (8 * kBlockRows);  // (block * steps + step) * depth + d
    const int64_t chunk = tile % (steps * depth);
    const int64_t block = tile / (steps * depth);
    const int64_t row = block * kBlockRows + r, col = chunk * 64 + j * 8;
    const uint4 v = row < n && col < k ? w[(row * k + col) / 8] : uint4{0, 0, 0, 0};
    packed[tile * (8 * kBlockRows) + r * 8 + (j ^ (r % 8))] = v;
  }
}

// The kernels built: (tokens, depth) of kernel_shape.
template <class F>
bool with_kernel(int tokens, int depth, F&& f) {
  if (tokens == 8 && depth == 4) return f(gemm_program_kernel<8, 4>), true;
  if (tokens == 16 && depth == 4) return f(gemm_program_kernel<16, 4>), true;
  if (tokens == 32 && depth == 2) return f(gemm_program_kernel<32, 2>), true;
  if (tokens == 64 && depth == 2) return f(gemm_program_kernel<64, 2>), true;
  return false;
}

}  // namespace

KernelShape kernel_shape(int m) {
  KernelShape s;
  s.tokens = wgmma::token_tile(m);
  // Why 4 chunks per step up to 16 tokens: one 32 KB weight copy per stage (2
  // chunks measured 0-4 % slower at TP 8 and TP 1, docs/performance.md); above,
  // the x tiles grow with the tokens and 2 chunks keep the ring deeper.
  s.depth = s.tokens <= 16 ? 4 : 2;
  // Shared memory: the aligned ring and its barriers.
  const int stage = s.depth * (wgmma::kTileBytes + s.tokens * wgmma::kChunkK * 2);
  auto bytes = [&](int stages) { return stages * stage + 2 * stages * 8 + wgmma::kAlign; };
  s.stages = 0;
  while (s.stages < wgmma::kMaxStages && bytes(s.stages + 1) <= kSmemPerCtaMax) ++s.stages;
  s.smem_bytes = bytes(s.stages);
  return s;
}

void prepare_program_kernels() {
  for (int tokens : {8, 16, 32, 64}) {
    const KernelShape s = kernel_shape(tokens);
    with_kernel(s.tokens, s.depth, [&](auto kernel) {
      TPD_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, s.smem_bytes));
    });
  }
}

int resident_ctas_per_sm(const KernelShape& s) {
  int blocks = 0;
  with_kernel(s.tokens, s.depth, [&](auto kernel) {
    TPD_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, s.smem_bytes));
  });
  return blocks;
}

int64_t packed_bytes(int64_t n, int64_t k, int depth) {
  const int64_t blocks = (n + kBlockRows - 1) / kBlockRows;
  return blocks * steps_of({n, k}, depth) * depth * wgmma::kTileBytes;
}

void pack_weight(const void* w, int64_t n, int64_t k, int depth, void* packed, cudaStream_t stream) {
  const int64_t pieces = packed_bytes(n, k, depth) / 16;
  const int64_t blocks = std::min<int64_t>((pieces + 255) / 256, 65535);
  pack_weight_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      static_cast<const uint4*>(w), n, k, steps_of({n, k}, depth), depth, static_cast<uint4*>(packed), pieces);
  TPD_CUDA(cudaGetLastError());
}

void launch_program(const Args& a, const KernelShape& s, int grid, bool pdl, cudaStream_t stream) {
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(static_cast<unsigned>(grid));
  c.blockDim = dim3(kThreads);
  c.dynamicSmemBytes = static_cast<std::size_t>(s.smem_bytes);
  c.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  c.attrs = attr;
  c.numAttrs = pdl ? 1 : 0;
  const bool built = with_kernel(s.tokens, s.depth, [&](auto kernel) { TPD_CUDA(cudaLaunchKernelEx(&c, kernel, a)); });
  if (!built) throw InvalidArgument("gemm program: no kernel for this row count");
}

}  // namespace tpdecode::program
