// The residual add + RMSNorm of one row, shared by ArNorm (ar_norm.cu) and the
// stock path's add-RMSNorm kernel (stock.cu) so both produce the same bits. The
// CPU reference (tests/support/reference.cpp) follows the same order.
//
// Launch shape: a cluster of kArNormCtas CTAs per row (grid (kArNormCtas, rows)),
// ar_norm_threads(hidden) threads per CTA, thread t of CTA c owning fragment
// c · hidden/64 + t of the row (threads past it hold nothing).
//
// Summation order of the row's sum of squares ss:
//   1. thread: s = 0; for its 8 values v in column order: s = fma(v, v, s)
//      (threads without a fragment contribute s = 0);
//   2. warp: butterfly, for offset 16, 8, 4, 2, 1: s = s + s[lane ^ offset];
//   3. CTA: w0 + w1, then + w2, + w3 ... in warp order;
//   4. cluster: the 8 CTA sums exchanged through distributed shared memory and
//      added in CTA order, (((c0 + c1) + c2) + ...) + c7, by every CTA alike.
// rstd = 1 / sqrt(ss / hidden + eps) is rounded correctly (__frsqrt_rn).
// Why explicit __fadd_rn / __fmul_rn / __fmaf_rn: nvcc must not contract or
// reassociate differently from the reference.
#pragma once

#include <cooperative_groups.h>
#include <cuda/ptx>

#include "comm/kernels.hpp"
#include "comm/memory.hpp"
#include "comm/row_quant.cuh"
#include "core/device.cuh"

namespace tpdecode::rownorm {

using lamport::Fragment;

inline constexpr int kMaxWarps = kArNormMaxThreads / 32;

// Shared memory of kN row sums taken at once: the CTA's warp sums and the
// cluster's CTA sums of each.
template <int kN>
struct RowSums {
  float warp[kMaxWarps][kN];
  float cta[kArNormCtas][kN];
};
using RowSumShared = RowSums<1>;

// BF16(reduced + residual) per element, one rounding.
__device__ __forceinline__ Fragment add_residual(const Fragment& reduced, const Fragment& residual) {
  Fragment out;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    out.w[j] = bf16::pack_rounded(__fadd_rn(bf16::low_of(reduced.w[j]), bf16::low_of(residual.w[j])),
                                  __fadd_rn(bf16::high_of(reduced.w[j]), bf16::high_of(residual.w[j])));
  return out;
}

// Step 1: s = fma(v, v, s) over the fragment's 8 values in column order.
__device__ __forceinline__ float thread_squares(const Fragment& f) {
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    s = __fmaf_rn(bf16::low_of(f.w[j]), bf16::low_of(f.w[j]), s);
    s = __fmaf_rn(bf16::high_of(f.w[j]), bf16::high_of(f.w[j]), s);
  }
  return s;
}

// Why: a CTA may store into a peer CTA's shared memory only once that peer has
// started (distributed shared memory rule). Every thread arrives on the cluster
// barrier at kernel start (relaxed: it orders nothing) and cluster_row_sum waits on
// it before its DSMEM stores; the work in between hides the wait.
__device__ __forceinline__ void cluster_arrive_started() { cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_relaxed); }

// A row sum's hook, called by every thread right after the sum's CTA-wide barrier
// (row_collective.cuh takes the CTA's epoch ticket there); none by default.
struct NoHook {
  __device__ __forceinline__ void operator()() const {}
};

// Steps 2-4 for the first n <= kN values of s at once, each summed in that order;
// on return s[j] is the row's total of value j, the same in every thread. Every
// thread of every CTA of the cluster must call it with the same n and `first`.
// first: the kernel's first row sum, after cluster_arrive_started() (it completes
// that barrier phase); a later one (first = false) stores into another RowSums.
// after_barrier: called by every thread once past the CTA barrier that follows the
// warp sums (each thread's every earlier memory operation is ordered before it).
template <int kN, class Hook = NoHook>
__device__ __forceinline__ void cluster_row_sums(float (&s)[kN], int n, RowSums<kN>& sh, bool first,
                                                 const Hook& after_barrier = Hook{}) {
  namespace cg = cooperative_groups;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    if (j >= n) continue;
#pragma unroll
    for (int offset = 16; offset >= 1; offset /= 2)
      s[j] = __fadd_rn(s[j], __shfl_xor_sync(0xffffffffu, s[j], offset));
    if (lane == 0) sh.warp[warp][j] = s[j];
  }
  __syncthreads();
  after_barrier();
  cg::cluster_group cluster = cg::this_cluster();
  const int me = static_cast<int>(cluster.block_rank());
  if (first) cuda::ptx::barrier_cluster_wait();  // every peer CTA has started
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    float cta = sh.warp[0][j];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) cta = __fadd_rn(cta, sh.warp[w][j]);
#pragma unroll
    for (int peer = 0; peer < kArNormCtas; ++peer) *cluster.map_shared_rank(&sh.cta[me][j], peer) = cta;
  }
  // Why: the cluster barrier (arrive.release / wait.acquire) makes every CTA's DSMEM
  // store visible before the reads below; no CTA touches a peer's shared memory
  // after the kernel's last one, so a CTA may exit as soon as it is through.
  cluster.sync();
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    if (j >= n) continue;
    float total = sh.cta[0][j];
#pragma unroll
    for (int c = 1; c < kArNormCtas; ++c) total = __fadd_rn(total, sh.cta[c][j]);
    s[j] = total;
  }
}

// Steps 2-4: the row's total over the cluster, the same value in every thread.
// Every thread of every CTA of the cluster must call it, after
// cluster_arrive_started() (it completes that barrier phase and holds one more).
__device__ __forceinline__ float cluster_row_sum(float s, RowSumShared& sh) {
  float sums[1] = {s};
  cluster_row_sums(sums, 1, sh, true);
  const float total = sums[0];
  return total;
}

// A kernel whose cluster loops over rows calls this between one row's
// cluster_row_sum and the next: every thread arrives once it has read this row's CTA
// sums (release), and the next cluster_row_sum waits on that phase before any CTA
// stores the next row's sums into the same shared slots.
__device__ __forceinline__ void cluster_arrive_next_row() { cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release); }

// ---- Steps 2-4 without a cluster barrier (ArNormRow's row sum) ----------------
// The 8 CTA sums are exchanged with st.async (a DSMEM store that completes bytes on
// the receiver's mbarrier) instead of DSMEM stores + cluster.sync(): the barrier's
// arrive.release is a MEMBAR.ALL.GPU, which waits for every outstanding global store
// of the thread, the NVLink pushes included. Here each CTA waits on its own
// mbarrier only: one arrival (its thread 0, announcing the 7 peers' 4 bytes each)
// plus the 7 peers' st.async (its own sum goes in with a plain store, before that
// arrival). The same order of additions as cluster_row_sums: the same bits.
struct RowSumAsync {
  float warp[kMaxWarps];
  float cta[kArNormCtas];
  uint64_t bar;  // one phase per row sum: 1 arrival + (kArNormCtas - 1) · 4 bytes
};
inline constexpr uint32_t kPeerSumBytes = (kArNormCtas - 1) * sizeof(float);
static_assert(kArNormCtas > 1, "st.async needs a cluster of more than one CTA");

// Thread 0 initialises the CTA's mbarrier; called BEFORE cluster_arrive_started()
// (by the same thread), so the started phase also publishes the initialisation to
// the peers: fence.mbarrier_init.release.cluster, then the relaxed arrive, and each
// peer's barrier.cluster.wait (acquire) before its first st.async (the pattern
// CUTLASS uses for its cluster pipelines). The CTA's own threads first touch it
// after the row sum's __syncthreads.
__device__ __forceinline__ void cluster_sum_async_init(RowSumAsync& sh) {
  if (threadIdx.x == 0) {
    dev::mbar_init(&sh.bar, 1);
    dev::mbar_init_fence();
  }
}

// st.async of one float into CTA `rank`'s copy of *local, completing 4 bytes on its
// copy of *bar (both mapped with mapa: same offsets in every CTA of the cluster).
__device__ __forceinline__ void st_async_peer(const float* local, const uint64_t* bar, uint32_t rank, float v) {
  uint32_t dst, remote_bar;
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(dst) : "r"(dev::shared_address(local)), "r"(rank));
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_bar) : "r"(dev::shared_address(bar)), "r"(rank));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(dst),
               "r"(__float_as_uint(v)), "r"(remote_bar)
               : "memory");
}

// Steps 2-4 of one value (cluster_row_sum's order and result). Every thread of every
// CTA of the cluster calls it, after cluster_sum_async_init() and
// cluster_arrive_started(); `phase`: 0 for the kernel's first row sum, then
// alternating. A kernel whose cluster loops over rows calls cluster_arrive_next_row()
// between two of them, as with cluster_row_sum (why: a peer's next st.async into
// sh.cta must follow this CTA's reads of it; the barrier's wait below orders them).
// Why no cluster barrier at the kernel's end: a CTA leaves only after its own phase
// completed, i.e. after all 7 peers' stores into it have landed, and no peer stores
// into it again (one st.async per peer per row sum; the next row's only after this
// CTA's arrive_next_row). A CTA may exit with its own st.async still in flight: what
// must stay alive is the receiver's shared memory, and the receiver waits for them.
// after_barrier: as cluster_row_sums's.
template <class Hook = NoHook>
__device__ __forceinline__ float cluster_row_sum_async(float s, RowSumAsync& sh, uint32_t phase,
                                                       const Hook& after_barrier = Hook{}) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
#pragma unroll
  for (int offset = 16; offset >= 1; offset /= 2) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, offset));
  if (lane == 0) sh.warp[warp] = s;
  __syncthreads();
  after_barrier();
  // Every peer CTA has started and initialised its mbarrier (the first row sum), or
  // has read the previous row's sums (cluster_arrive_next_row).
  cuda::ptx::barrier_cluster_wait();
  if (threadIdx.x == 0) {
    float cta = sh.warp[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) cta = __fadd_rn(cta, sh.warp[w]);
    const uint32_t me = cuda::ptx::get_sreg_cluster_ctarank();
    sh.cta[me] = cta;
    // Release: publishes sh.cta[me] to the CTA's waiters. Peers' bytes may land
    // before it (the tx-count goes negative; the phase still needs this arrival),
    // but never a later row sum's: those follow the next barrier.cluster phase,
    // which every thread here enters only after its wait below.
    dev::mbar_arrive_expect_tx(&sh.bar, kPeerSumBytes);
#pragma unroll
    for (uint32_t peer = 1; peer < kArNormCtas; ++peer)
      st_async_peer(&sh.cta[me], &sh.bar, (me + peer) % kArNormCtas, cta);
  }
  dev::mbar_wait_cluster(&sh.bar, phase);
  float total = sh.cta[0];
#pragma unroll
  for (int c = 1; c < kArNormCtas; ++c) total = __fadd_rn(total, sh.cta[c]);
  return total;
}

// An epilogue's kernel start (instead of cluster_arrive_started()): the epilogue's
// cluster state, if it has any (ArNormRow's mbarrier), initialised first.
template <class Epilogue>
__device__ __forceinline__ void cluster_start(Epilogue& epi) {
  if constexpr (requires { epi.init_cluster(); }) epi.init_cluster();
  cluster_arrive_started();
}

// rstd = 1 / sqrt(total / hidden + eps), correctly rounded.
__device__ __forceinline__ float rstd(float total, int hidden, float eps) {
  return __frsqrt_rn(__fadd_rn(__fdiv_rn(total, static_cast<float>(hidden)), eps));
}

// BF16(v · rstd · w), one rounding.
__device__ __forceinline__ Fragment normed(const Fragment& v, const Fragment& weight, float r) {
  Fragment out;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    out.w[j] = bf16::pack_rounded(__fmul_rn(__fmul_rn(bf16::low_of(v.w[j]), r), bf16::low_of(weight.w[j])),
                                  __fmul_rn(__fmul_rn(bf16::high_of(v.w[j]), r), bf16::high_of(weight.w[j])));
  return out;
}

// ArNorm's epilogue of a row (row_collective.cuh): the residual add, the new
// residual stored, the RMSNorm, stored as BF16 or quantised (row_quant.cuh). A
// failed call (ok false) poisons its residual and, through a NaN sum of squares,
// every output of its row: an output is correct or NaN, never wrong. Tail: the
// kernel's ArNormTail, held by reference, so it stays in parameter space rather
// than in registers. The row sum: cluster_row_sum_async (no cluster barrier); the
// kernel starts with cluster_start(epi), and a cluster looping over rows calls
// cluster_arrive_next_row() between two rows' finish().
// kQuantized: the output may be quantised (RowStore).
template <bool kQuantized = true>
struct ArNormRow {
  const ArNormTail& t;
  int hidden;
  RowSumAsync* shared;
  Fragment w{}, old{};
  uint32_t phase = 0;  // of shared->bar: flips with every row sum
  rowquant::RowStore<kQuantized> store{t.quant};

  __device__ __forceinline__ void init_cluster() { cluster_sum_async_init(*shared); }

  __device__ __forceinline__ void load_params(int frag, bool active) {
    if (active) w = static_cast<const Fragment*>(t.weight)[frag];
  }
  __device__ __forceinline__ void load_inputs(int, long at, bool active) {
    if (active && t.residual) old = static_cast<const Fragment*>(t.residual)[at];
    store.load();
  }
  // Both stores after the row sum (why, with cluster_row_sum: the cluster
  // barrier's fence would wait for a store issued before it; kept so here).
  // after_barrier: row_collective.cuh's hook (it takes the CTA's epoch ticket), run
  // once by every thread after the row sum's CTA barrier; NoHook{} for callers that
  // take their ticket themselves.
  template <class Hook>
  __device__ __forceinline__ void finish(Fragment fresh, bool ok, int, long at, int, bool active,
                                         const Hook& after_barrier) {
    if (active && ok && t.residual) fresh = add_residual(fresh, old);
    const float squares = ok ? thread_squares(fresh) : __int_as_float(0x7fc00000);
    const float total = cluster_row_sum_async(squares, *shared, phase, after_barrier);
    phase ^= 1u;
    store.store(t.out, at, normed(fresh, w, rstd(total, hidden, t.eps)), active);
    if (active) static_cast<Fragment*>(t.residual_out)[at] = ok ? fresh : lamport::poisoned();
  }
};

}  // namespace tpdecode::rownorm
