// The collectives' kernels as the host sees them: launch parameters, launchers and
// co-residency budgets (the kernels live in all_reduce.cu, ar_norm.cu, gather.cu,
// two_shot.cu and stock.cu). Arguments are checked by the caller (tp_comm.cpp);
// launchers launch on the stream they are given.
#pragma once

#include <cuda_runtime_api.h>

#include "comm/protocol.hpp"
#include "team/rank_context.hpp"
#include "tpdecode/comm.hpp"

namespace tpdecode {

// ---- One-shot all-reduce (all_reduce.cu) ------------------------------------
struct OneShotParams {
  lamport::TeamRef team;
  lamport::MailboxRef box;  // [parities, TP, rows_cap, row_bytes]
  const void* x;            // [rows, width] bf16
  void* out;                // [rows, width] bf16
  int frags;                // width / 8
  bool trigger_early;       // launch dependents before the polls (one rank per GPU)
  bool system_fence;        // CommConfig::system_fence
  bool clean_sum;           // CommConfig::batch_invariant: the sum cleaned as a mailbox would
};
void launch_one_shot(const RankContext& ctx, cudaStream_t stream, const OneShotParams& p, int rows);
// Rows of `width` columns whose grids every rank on ctx's GPU can hold at once.
int one_shot_resident_rows(const RankContext& ctx, int64_t width);

// ---- ArNorm: one-shot all-reduce + residual add + RMSNorm (ar_norm.cu) -------
inline constexpr int kArNormCtas = 8;         // CTAs per row (one cluster)
inline constexpr int kArNormMaxThreads = 256;  // 8 columns per thread: hidden <= 16384

static_assert(kArNormMaxHidden == 8 * kArNormCtas * kArNormMaxThreads, "comm.hpp's served sizes are this geometry's");
constexpr int ar_norm_threads(int64_t hidden) { return static_cast<int>((hidden / 64 + 31) / 32 * 32); }

// What the normalised row is written as (ArNormIo::quant, row_quant.cuh).
struct RowQuant {
  ArNormQuant kind = ArNormQuant::kNone;
  float* scale = nullptr;  // kStatic: [1] (read); kGroup*: [rows, H / 128] (written)
};

// The residual add + RMSNorm's tensors as a kernel that reduced its rows holds them
// (row_norm.cuh's ArNormRow): ArNorm, its two-shot variant, the stock path's norm,
// the o-projection's consumers.
struct ArNormTail {
  const void* residual;  // [rows, H] bf16, or nullptr: none
  const void* weight;    // [H] bf16
  void* out;             // [rows, H] bf16, or e4m3 when quant.kind is not kNone
  void* residual_out;    // [rows, H] bf16
  float eps;
  RowQuant quant = {};
};
// The tail of an ArNormIo (rules.hpp has checked its tensors).
inline ArNormTail ar_norm_tail(const ArNormIo& io) {
  return {io.residual.data, io.weight.data, io.out.data, io.residual_out.data, io.eps,
          RowQuant{io.quant, static_cast<float*>(io.scale.data)}};
}

struct ArNormParams {
  lamport::TeamRef team;
  lamport::MailboxRef box;  // [parities, TP, rows_cap, row_bytes]
  const void* x;            // [rows, hidden] bf16
  ArNormTail norm;
  int hidden;
  bool trigger_early;
  bool system_fence;  // CommConfig::system_fence
  bool clean_sum;     // CommConfig::batch_invariant: the sum cleaned as a mailbox would
};
void launch_ar_norm(const RankContext& ctx, cudaStream_t stream, const ArNormParams& p, int rows);
int ar_norm_resident_rows(const RankContext& ctx, int64_t hidden);

// ---- Gather (gather.cu) -----------------------------------------------------
struct GatherParams {
  lamport::TeamRef team;
  lamport::MailboxRef box;  // [parities, 1, rows_cap, row_bytes >= TP · shard bytes]
  const void* shard;        // [rows, shard_frags · 16 bytes]
  void* out;                // [rows, TP · shard_frags · 16 bytes]
  int shard_frags;
  bool trigger_early;
};
void launch_gather(const RankContext& ctx, cudaStream_t stream, const GatherParams& p, int rows);
// Rows whose grid (at least one CTA per row) every rank on ctx's GPU can hold.
int gather_resident_rows(const RankContext& ctx);

// ---- The stock path's kernels (stock.cu) ----------------------------------
// out[row] = rank-order sum of the cleaned src.base[r] + row · src_row_bytes (bf16
// [rows, width]: the one-shot's sum); clean_sum: the sum cleaned too (batch-invariant).
void launch_stock_reduce(cudaStream_t stream, int size, const PeerPointers& src, long src_row_bytes, void* out,
                         int rows, int width, bool clean_sum);
// ArNorm's residual add + RMSNorm on an already reduced [rows, hidden] (same math
// and order as ar_norm, and its epilogues: the same bits).
struct NormIo {
  const void* reduced;  // [rows, hidden] bf16
  ArNormTail norm;
  int hidden;
};
// pdl: launch as a programmatic dependent (the kernel lets its successor launch at
// entry and waits for its predecessor before reading anything).
void launch_add_rms_norm(cudaStream_t stream, const NormIo& io, int rows, bool pdl);
// out[row] = [src.base[0] row, ..., src.base[size-1] row] (shard_bytes each); clean:
// sentinel words as 0, as the mailbox moves them (batch-invariant).
void launch_gather_copy(cudaStream_t stream, int size, const PeerPointers& src, long src_row_bytes, void* out, int rows,
                        long shard_bytes, bool clean);

// ---- Two-shot all-reduce and its ArNorm (two_shot.cu) ------------------------
// Rank o owns columns [o·W, (o+1)·W), W = width / TP (a multiple of 8). Both grids
// are bounded independently of the row count (every thread loops over its items),
// so any rows up to the mailboxes' rows_cap are served wherever one CTA (one
// cluster for the norm) per rank fits.
struct TwoShotParams {
  lamport::TeamRef team;
  lamport::MailboxRef recv;    // [parities, TP, rows_cap, >= W] bf16, in every owner's memory
  lamport::MailboxRef gather;  // [parities, 1, rows_cap, >= width] bf16; recv's epoch counter
  const void* x;               // [rows, width] bf16: this rank's partial
  void* out;                   // [rows, width] bf16: the sum (all-reduce) or RMSNorm(new residual) · weight
  int width;
  int rows;
  bool trigger_early;  // launch dependents before the polls (one rank per GPU)
};
// The ArNorm variant: the same rows as ar_norm.cu (row_norm.cuh), so the same bits.
struct TwoShotNormParams {
  TwoShotParams base;  // base.out unused: the outputs are norm's
  ArNormTail norm;     // [rows, width] bf16, weight [width]
};
// max_ctas / max_clusters: the budget below, computed once per team.
void launch_two_shot_all_reduce(const RankContext& ctx, cudaStream_t stream, const TwoShotParams& p, int max_ctas);
void launch_two_shot_ar_norm(const RankContext& ctx, cudaStream_t stream, const TwoShotNormParams& p,
                             int max_clusters);
// CTAs (clusters of kArNormCtas for the norm, at the widest row) that every rank
// on ctx's GPU can hold at once.
int two_shot_all_reduce_budget(const RankContext& ctx);
int two_shot_ar_norm_budget(const RankContext& ctx, int64_t hidden);

}  // namespace tpdecode
