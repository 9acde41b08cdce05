// Does one global hop per op boundary make a persistent chain's boundary cheap? The
// question behind the row form of a program (docs/performance.md, "Chains"). The TP 8
// drafter chain (5 layers x qkv_a 2112x7168, q_b 2304x1536, o_proj 7168x1536, gate_up
// 4608x7168, down 7168x2304; 792 MB) as one persistent kernel, one CTA per SM, in which
// CTA c owns rows [r0(c), r0(c+1)) of every op (2-row granularity) with the whole K: no
// split-K, no finisher. Its weights (packed per CTA, each 64-column chunk's rows 128
// swizzled bytes) come through a ring of 32 KB bulk copies; 8 consumer warps take every
// 8th chunk with ldmatrix + mma.sync m16n8k16 (the weight rows as A, x as B: each lane
// reads 32 contiguous bytes of x from L2 with relaxed loads, kPrefetch chunks ahead),
// sum their partials in warp order in shared memory at the op's end and publish the
// rows as BF16 into a Lamport mailbox (0xFFFF empty; two epochs, the other emptied
// during the run); the next op's lanes poll only the words they multiply.
//   dep:  x = the previous op's mailbox;  free: x = ready inputs (no op waits).
// Forms chosen when compiling: -DPF=n (chunks of x requested ahead, default 3),
// -DREPOLL (after a poll, request the later chunks' x again: it was asked before it
// was ready), -DBACKOFF=ns (a sleep before each poll), -DWARP_POLL (one polling lane
// a warp), -DNOMATH (the consumers skip the MMAs: outputs wrong, checks ignored).
// Checks sampled rows of every op against a double dot product with the x it read,
// then times graphs of 20 runs against the benchmarks' streaming read of the same bytes
// (tools/read_ceiling.cu). Built and run by `scripts/device.sh row-form`.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "core/device.cuh"
#include "core/graph_timing.hpp"
#include "core/hash.hpp"
#include "program/program_activations.cuh"
#include "read_ceiling.hpp"
#include "tpdecode/device_buffer.hpp"
#include "tpdecode/error.hpp"

using namespace tpdecode;

#ifndef PF
#define PF 3
#endif
constexpr int kOps = 25, kMaxTokens = 8, kWarps = 8, kThreads = 32 * (kWarps + 1);
// A stage holds up to 32 KB of chunks; the last 16-row tile of a share reads up to 15
// rows past it (rows nobody keeps), hence the stride's slack.
constexpr int kStageData = 32768, kStageStride = kStageData + 2048, kMaxStages = 6, kMaxTiles = 4;
constexpr int kShapes[5][2] = {{2112, 7168}, {2304, 1536}, {7168, 1536}, {4608, 7168}, {7168, 2304}};
constexpr uint16_t kEmpty = 0xffff;  // a mailbox value nobody published (a NaN the epilogue never stores)

struct Op {
  int n, k;
  float scale;            // the weights' range: sqrt(3 / k), each output of variance ~1
  const uint8_t* packed;  // [cta][chunk][row][128 B], CTA c's region at r0(c) * k * 2
  const uint16_t* x;      // free form: [token][k]; dep form: unused for ops > 0
  int64_t box;            // this op's mailbox offset (elements) within an epoch: [token][n]
};
struct Args {
  Op ops[kOps];
  uint16_t* mailbox;  // 2 epochs
  int64_t epoch_elems;
  int m, stages, cap, epoch, dep;
};

// CTA c's first row of an op of n rows, over g CTAs (2-row granularity).
__host__ __device__ inline int row0(int n, int c, int g) {
  return c == g ? n : static_cast<int>((int64_t(c) * n / g) & ~1LL);
}
__host__ __device__ inline float weight_value(const Op& op, int o, int r, int c) {
  return hash::uniform24(hash::keyed(o, int64_t(r) * op.k + c)) * op.scale;
}

// Packed element (r, c) of a chunk (64 columns): 16-byte group g = (c % 16) / 2 at slot
// g ^ (r % 8), its pair c / 16, element c % 2. So lane j % 4 of ldmatrix's rows meets
// columns 16 j + 2 g + {0, 1}: a lane's 8 x words of a chunk (16 columns) are contiguous,
// and ldmatrix reads without bank conflicts.
__global__ void pack_kernel(Op op, int o, int g) {
  const int64_t total = int64_t(op.n) * op.k;
  uint16_t* out = reinterpret_cast<uint16_t*>(const_cast<uint8_t*>(op.packed));
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(e / op.k), c = static_cast<int>(e % op.k);
    // The CTA owning row r: the largest c with row0(c) <= r.
    int lo = 0, hi = g;
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      (row0(op.n, mid, g) <= r ? lo : hi) = mid;
    }
    const int r0 = row0(op.n, lo, g), rows = row0(op.n, lo + 1, g) - r0, rr = r - r0;
    const int q = c / 64, cc = c % 64;
    const int grp = (cc % 16) / 2, pair = cc / 16, half = cc % 2;
    const int64_t at = int64_t(r0) * op.k + (int64_t(q) * rows + rr) * 64 + ((grp ^ (rr % 8)) * 8) + pair * 2 + half;
    out[at] = bf16::from_float(weight_value(op, o, r, c));
  }
}

// An arrival that counts `count` (the weight producer's, for the warps that will not
// touch a stage).
__device__ __forceinline__ void mbar_arrive_count(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(dev::shared_address(bar)), "r"(count) : "memory");
}
// Whether a word (two BF16 values) or a 16-byte piece holds a value not yet published.
__device__ __forceinline__ bool has_empty_half(uint32_t w) { return (w & 0xffffu) == kEmpty || (w >> 16) == kEmpty; }
__device__ __forceinline__ bool has_empty_half(const uint4& v) {
  return has_empty_half(v.x) || has_empty_half(v.y) || has_empty_half(v.z) || has_empty_half(v.w);
}

// A warp's walk over its chunks: chunk q of op o with q % kWarps == warp, op by op; `seq`
// numbers the CTA's ring stages across the program.
struct Cursor {
  const Args* a;
  int warp, op, q, r0, rows, per_stage, chunks, stage_base;
  __device__ void enter(int o, int base) {
    op = o;
    q = warp;
    stage_base = base;
    if (o >= kOps) return;
    const Op& d = a->ops[o];
    r0 = row0(d.n, blockIdx.x, gridDim.x);
    rows = row0(d.n, blockIdx.x + 1, gridDim.x) - r0;
    chunks = d.k / 64;
    per_stage = min(chunks, kStageData / (rows * 128));
  }
  __device__ bool valid() const { return op < kOps; }
  __device__ int stages() const { return (chunks + per_stage - 1) / per_stage; }
  __device__ void advance() {
    q += kWarps;
    if (q >= chunks) enter(op + 1, stage_base + stages());
  }
  __device__ int seq() const { return stage_base + q / per_stage; }
  // This warp's x words of the chunk for token `lane / 4` (zero past m).
  __device__ const uint16_t* x_words(int lane) const {
    const int token = lane / 4;
    const Op& d = a->ops[op];
    const int col = q * 64 + 16 * (lane % 4);
    if (a->dep && op > 0) {
      const Op& prev = a->ops[op - 1];
      return a->mailbox + a->epoch * a->epoch_elems + prev.box + int64_t(token) * prev.n + col;
    }
    return d.x + int64_t(token) * d.k + col;
  }
};

// A lane's x for the chunk at `c`: 32 bytes of token lane / 4, zeros past m.
__device__ __forceinline__ void load_x(const Cursor& c, int lane, uint4 (&b)[2]) {
  if (lane / 4 < c.a->m) {
    const uint16_t* p = c.x_words(lane);
    b[0] = program::load_relaxed16(p);
    b[1] = program::load_relaxed16(p + 8);
  } else {
    b[0] = b[1] = uint4{0, 0, 0, 0};
  }
}

// Until none of this lane's x words of the chunk at `c` is empty; whether it waited.
// Every lane polls its own words, or (-DWARP_POLL) one lane with empty words polls
// while the others wait, then they all load again: 32 times fewer polls beside the
// weight stream. Called by the whole warp.
__device__ __forceinline__ bool wait_for_x(const Cursor& c, int lane, uint4 (&b)[2]) {
  auto empty = [&] { return lane / 4 < c.a->m && (has_empty_half(b[0]) || has_empty_half(b[1])); };
  const uint64_t start = dev::global_timer_ns();
  auto poll = [&] {
#ifdef BACKOFF
    __nanosleep(BACKOFF);  // fewer polls in flight beside the weight stream
#endif
    if (dev::global_timer_ns() - start > dev::kMbarTimeoutNs) __trap();
    load_x(c, lane, b);
  };
#ifdef WARP_POLL
  bool waited = false;
  for (unsigned who; (who = __ballot_sync(0xffffffffu, empty())) != 0;) {
    waited = true;
    if (lane == __ffs(who) - 1)
      while (empty()) poll();
    __syncwarp();
    if (empty()) load_x(c, lane, b);
  }
  return waited;
#else
  if (!empty()) return false;
  while (empty()) poll();
  return true;
#endif
}

__global__ void __launch_bounds__(kThreads, 1) row_form_kernel(const __grid_constant__ Args a) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* ring = smem;
  float* red = reinterpret_cast<float*>(smem + kMaxStages * kStageStride);  // [warp][tile][lane][4]
  uint64_t* full = reinterpret_cast<uint64_t*>(red + kWarps * kMaxTiles * 32 * 4);
  uint64_t* empty = full + kMaxStages;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid < a.stages) {
    dev::mbar_init(full + tid, 1);
    dev::mbar_init(empty + tid, kWarps);
    dev::mbar_init_fence();
  }
  __syncthreads();
  if (warp == kWarps) {  // the weight producer: stages in program order, `cap` of them in flight
    if (lane != 0) return;
    const uint64_t policy = dev::evict_first_policy();
    Cursor c{&a, 0};
    for (c.enter(0, 0); c.valid(); c.enter(c.op + 1, c.stage_base + c.stages())) {
      const Op& d = a.ops[c.op];
      for (int s = 0; s < c.stages(); ++s) {
        const int seq = c.stage_base + s, slot = seq % a.stages;
        dev::mbar_wait(empty + slot, ((seq / a.stages) & 1) ^ 1);
        if (seq >= a.cap) dev::mbar_wait(full + (seq - a.cap) % a.stages, ((seq - a.cap) / a.stages) & 1);
        const int first = s * c.per_stage, count = min(c.per_stage, c.chunks - first);
        const uint32_t bytes = uint32_t(count) * c.rows * 128;
        dev::mbar_arrive_expect_tx(full + slot, bytes);
        dev::bulk_copy_to_shared(ring + slot * kStageStride,
                                 d.packed + int64_t(c.r0) * d.k * 2 + int64_t(first) * c.rows * 128, bytes, full + slot,
                                 policy);
        const int touching = min(count, kWarps);  // the warps that will release the stage
        if (touching < kWarps) mbar_arrive_count(empty + slot, kWarps - touching);
      }
    }
    return;
  }
  // Empty this CTA's share of the other epoch (the next run publishes into it).
  {
    uint4* other = reinterpret_cast<uint4*>(a.mailbox + (a.epoch ^ 1) * a.epoch_elems);
    const int64_t pieces = a.epoch_elems / 8, per = (pieces + gridDim.x - 1) / gridDim.x;
    for (int64_t i = blockIdx.x * per + tid; i < min(pieces, (blockIdx.x + 1) * per); i += 32 * kWarps)
      other[i] = uint4{~0u, ~0u, ~0u, ~0u};
  }
  constexpr int kPrefetch = PF;
  Cursor cp{&a, warp}, ld{&a, warp};  // the chunk multiplied, the chunk whose x is requested
  cp.enter(0, 0);
  ld.enter(0, 0);
  uint4 b[kPrefetch][2];
#pragma unroll
  for (int p = 0; p < kPrefetch; ++p) {
    b[p][0] = b[p][1] = uint4{0, 0, 0, 0};
    if (ld.valid()) {
      load_x(ld, lane, b[p]);
      ld.advance();
    }
  }
  float acc[kMaxTiles][4] = {};
  while (cp.valid()) {
#pragma unroll
    for (int p = 0; p < kPrefetch; ++p) {
      if (!cp.valid()) break;
      if (wait_for_x(cp, lane, b[p])) {
#ifdef REPOLL
        // The later chunks' x was requested before this one was ready: ask again now,
        // so that the catch-up after a boundary costs one more round trip, not one a chunk.
        Cursor next = cp;
#pragma unroll
        for (int d = 1; d < kPrefetch; ++d) {
          next.advance();
          if (next.valid()) load_x(next, lane, b[(p + d) % kPrefetch]);
        }
#endif
      }
      const int seq = cp.seq(), slot = seq % a.stages;
      dev::mbar_wait(full + slot, (seq / a.stages) & 1);
      const uint8_t* stage = ring + slot * kStageStride;
      const int tiles = (cp.rows + 15) / 16;
#ifndef NOMATH
      const int qi = cp.q % cp.per_stage;
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint32_t b0 = dev::word(b[p][s / 2], 2 * (s % 2)), b1 = dev::word(b[p][s / 2], 2 * (s % 2) + 1);
#pragma unroll
        for (int t = 0; t < kMaxTiles; ++t) {
          if (t >= tiles) break;
          // ldmatrix: lanes 0-7 rows 0-7 and lanes 8-15 rows 8-15 of group 2s, lanes
          // 16-31 the same rows of group 2s + 1 (the A fragment's four matrices).
          const int row = 16 * t + lane % 8 + 8 * ((lane / 8) % 2), group = 2 * s + lane / 16;
          uint32_t r[4];
          dev::ldmatrix_x4(r, dev::shared_address(stage + (qi * cp.rows + row) * 128 + ((group ^ (row % 8)) * 16)));
          dev::mma_bf16(acc[t], r[0], r[1], r[2], r[3], b0, b1);
        }
      }
#else
      // No math: the stage and the x words still consumed (the sum keeps the loads).
      acc[0][0] += __uint_as_float((b[p][0].x ^ b[p][1].w) & 0x3f800000u) * float(stage[lane]);
#endif
      const bool last_in_op = cp.q + kWarps >= cp.chunks;
      if (last_in_op || (cp.q + kWarps) / cp.per_stage != cp.q / cp.per_stage) {
        __syncwarp();
        if (lane == 0) dev::mbar_arrive(empty + slot);
      }
      if (last_in_op) {  // the op's end: the warps' partials summed in warp order, published
        const Op& d = a.ops[cp.op];
#pragma unroll
        for (int t = 0; t < kMaxTiles; ++t)
#pragma unroll
          for (int i = 0; i < 4; ++i) red[((warp * kMaxTiles + t) * 32 + lane) * 4 + i] = acc[t][i];
        dev::named_barrier_sync(1, 32 * kWarps);
        if (warp < tiles) {
          float sum[4] = {0, 0, 0, 0};
          for (int w = 0; w < kWarps; ++w)
#pragma unroll
            for (int i = 0; i < 4; ++i) sum[i] += red[((w * kMaxTiles + warp) * 32 + lane) * 4 + i];
          uint16_t* box = a.mailbox + a.epoch * a.epoch_elems + d.box;
#pragma unroll
          for (int i = 0; i < 4; ++i) {  // the m16n8 fragment: rows lane / 4 (+ 8), tokens 2 (lane % 4) (+ 1)
            const int row = 16 * warp + lane / 4 + (i >= 2 ? 8 : 0), token = 2 * (lane % 4) + (i & 1);
            if (row < cp.rows && token < a.m) {
              uint16_t v = bf16::from_float(sum[i]);
              box[int64_t(token) * d.n + cp.r0 + row] = v == kEmpty ? 0x7fff : v;
            }
          }
        }
        dev::named_barrier_sync(1, 32 * kWarps);
#pragma unroll
        for (int t = 0; t < kMaxTiles; ++t)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[t][i] = 0.0f;
      }
      cp.advance();
      if (ld.valid()) {
        load_x(ld, lane, b[p]);
        ld.advance();
      }
    }
  }
}

int main() try {
  cudaDeviceProp prop;
  TPD_CUDA(cudaGetDeviceProperties(&prop, 0));
  const int g = prop.multiProcessorCount;
  Args a{};
  int64_t packed_total = 0, box_total = 0, x_total = 0;
  for (int o = 0; o < kOps; ++o) {
    Op& op = a.ops[o];
    op.n = kShapes[o % 5][0];
    op.k = kShapes[o % 5][1];
    if (op.k / 64 < kWarps || op.k % 64 != 0 || row0(op.n, 1, g) > 16 * kMaxTiles) throw InvalidArgument("shape");
    op.scale = std::sqrt(3.0f / op.k);
    op.box = box_total;
    packed_total += int64_t(op.n) * op.k * 2;
    box_total += int64_t(kMaxTokens) * op.n;
    x_total += int64_t(kMaxTokens) * op.k;
  }
  const DeviceBuffer packed_buffer(packed_total), mailbox_buffer(2 * box_total * 2), xs_buffer(x_total * 2);
  uint8_t* packed = packed_buffer.as<uint8_t>();
  uint16_t* mailbox = mailbox_buffer.as<uint16_t>();
  uint16_t* xs = xs_buffer.as<uint16_t>();
  a.mailbox = mailbox;
  a.epoch_elems = box_total;
  std::vector<uint16_t> hx(x_total);
  for (int64_t i = 0; i < x_total; ++i) hx[i] = bf16::from_float(hash::uniform24(hash::keyed(1000, i)));
  TPD_CUDA(cudaMemcpy(xs, hx.data(), x_total * 2, cudaMemcpyHostToDevice));
  int64_t off = 0, xoff = 0;
  for (int o = 0; o < kOps; ++o) {
    a.ops[o].packed = packed + off;
    a.ops[o].x = xs + xoff;
    off += int64_t(a.ops[o].n) * a.ops[o].k * 2;
    xoff += int64_t(kMaxTokens) * a.ops[o].k;
    pack_kernel<<<4 * g, 512>>>(a.ops[o], o, g);
  }
  TPD_CUDA(cudaGetLastError());
  TPD_CUDA(cudaDeviceSynchronize());
  const int smem = kMaxStages * kStageStride + kWarps * kMaxTiles * 32 * 16 + 2 * kMaxStages * 8;
  TPD_CUDA(cudaFuncSetAttribute(row_form_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  std::string form;
#ifdef REPOLL
  form += ", x asked again after a poll";
#endif
#ifdef BACKOFF
  form += ", a sleep before each poll";
#endif
#ifdef WARP_POLL
  form += ", one polling lane a warp";
#endif
#ifdef NOMATH
  form += ", no MMAs";
#endif
  printf("row form probe: %s, %d SMs, %.1f MB of weights, x requested %d chunks ahead%s\n", prop.name, g,
         packed_total / 1e6, PF, form.c_str());

  TimingStream timing;
  const cudaStream_t st = timing.get();
  auto run = [&](cudaStream_t s, int m, int dep, int cap, int epoch) {
    Args r = a;
    r.m = m, r.dep = dep, r.stages = kMaxStages, r.cap = cap, r.epoch = epoch;
    row_form_kernel<<<g, kThreads, smem, s>>>(r);
  };
  // The read ceiling of the same bytes: the benchmarks' streaming read (best of its shapes).
  const double read_us = bench::time_streaming_read(packed, packed_total, 1, 10, 7, st);
  printf("read: %.1f us = %.2f TB/s\n", read_us, packed_total / read_us / 1e6);

  // One run into epoch 0 from emptied mailboxes; 24 sampled rows of every op against a
  // double dot product of its weights with the x it read; every output published.
  bool ok = true;
  for (int m : {1, 8})
    for (int dep : {1, 0}) {
      TPD_CUDA(cudaMemsetAsync(mailbox, 0xff, 2 * box_total * 2, st));
      run(st, m, dep, 2, 0);
      TPD_CUDA(cudaGetLastError());
      TPD_CUDA(cudaStreamSynchronize(st));
      std::vector<uint16_t> box(box_total);
      TPD_CUDA(cudaMemcpy(box.data(), mailbox, box_total * 2, cudaMemcpyDeviceToHost));
      double worst = 0;
      int empties = 0;
      for (int o = 0; o < kOps; ++o) {
        const Op& d = a.ops[o];
        for (int i = 0; i < 24; ++i) {
          const int row = static_cast<int>(hash::keyed(2000 + o, i) % d.n);
          for (int t = 0; t < m; ++t) {
            double ref = 0;
            for (int c = 0; c < d.k; ++c) {
              const uint16_t xv = dep && o > 0 ? box[a.ops[o - 1].box + int64_t(t) * a.ops[o - 1].n + c]
                                               : hx[(d.x - xs) + int64_t(t) * d.k + c];
              ref += double(bf16::to_float(bf16::from_float(weight_value(d, o, row, c)))) * bf16::to_float(xv);
            }
            const double got = bf16::to_float(box[d.box + int64_t(t) * d.n + row]);
            worst = std::max(worst, std::fabs(got - ref) / (0.02 + std::fabs(ref)));
          }
        }
        for (int t = 0; t < m; ++t)
          for (int row = 0; row < d.n; ++row) empties += box[d.box + int64_t(t) * d.n + row] == kEmpty;
      }
      const bool good = worst < 0.01 && empties == 0;
      ok &= good;
      printf("check M %d %s: worst relative error %.2e, outputs never published %d -> %s\n", m, dep ? "dep" : "free",
             worst, empties, good ? "ok" : "WRONG");
    }
#ifndef NOMATH
  if (!ok) return 1;
#else
  printf("(no MMAs: the outputs are wrong by design)\n");
#endif

  TPD_CUDA(cudaMemsetAsync(mailbox, 0xff, 2 * box_total * 2, st));
  for (int m : {1, 8})
    for (int cap : {2, 3, kMaxStages})
      for (int dep : {1, 0}) {
        // 20 runs a graph, their epochs alternating (each run empties the other one).
        const double us = time_graph(
                              st, [&](cudaStream_t s, int call) { run(s, m, dep, cap, call % 2); }, 20, 7)
                              .median_us;
        printf("M %d, %d stages (%d KB) in flight, %-4s: %7.1f us = %5.1f %% of the read\n", m, cap, cap * 32,
               dep ? "dep" : "free", us, 100.0 * read_us / us);
      }
  TPD_CUDA(cudaDeviceSynchronize());
  return 0;
} catch (const std::exception& e) {
  fprintf(stderr, "row_form_probe: %s\n", e.what());
  return 1;
}
