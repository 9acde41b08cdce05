// The o-projection's kernels as the host sees them (oproj.cu): launch parameters,
// launchers, the host preparation and the co-residency budgets. Arguments are
// checked by the caller (prepared_oproj.cpp); launchers launch on the stream given.
#pragma once

#include <cuda_runtime_api.h>

#include "comm/kernels.hpp"
#include "comm/protocol.hpp"
#include "gemm/warp_splitk_launch.hpp"
#include "team/rank_context.hpp"
#include "tpdecode/oproj.hpp"

namespace tpdecode {

// The AttnRes epilogue's tensors (attn_res.cuh has the math; [rows, H] unless said).
struct AttnResTail {
  const void* partial;      // p (unused when new_block)
  void* partial_out;        // p'
  const void* blocks;       // [nb, rows, H]
  long block_stride;        // elements between saved blocks: rows · H
  int nb;
  bool new_block;
  const void* key_norm;     // [H] g
  const void* query;        // [H] q
  const void* out_norm;     // [H] w
  float eps;
  void* out;
  const void* next_key_norm;  // [H] g' (bind_ahead), or nullptr: none
  const void* next_query;     // [H] q'
  float next_eps;
  float* stats;             // [rows, 2] f32
  float* mixture;           // [rows, H] f32
};

struct OprojParams {
  lamport::TeamRef team;
  lamport::MailboxRef box;     // [2, TP, rows_cap, H] bf16 (one-shot)
  lamport::MailboxRef recv;    // [2, TP, rows_cap, H / TP] bf16 (two-shot: this rank's owned columns)
  lamport::MailboxRef gather;  // [2, 1, rows_cap, H] bf16 (two-shot; recv's epoch counter)
  bool two_shot;
  WarpSplitKParams gemm;    // w [H, K], x [rows, K]; out unused
  int split;                // the GEMM's K split (1 .. 8)
  int token_tiles;
  int hidden;
  bool trigger_early;  // one rank per GPU: producers let the consumer launch from their epilogue; consumers poll early
  bool system_fence;   // CommConfig::system_fence: producers fence before their pushes
  OprojEpilogue epilogue;
  ArNormTail ar_norm;     // kArNorm
  AttnResTail attn_res;   // kAttnRes
};

// Host work before the first launch of `tiles` token tiles (shared-memory
// limits); never under capture.
void prepare_oproj_producer(int team_size, int tiles);
void prepare_oproj_fused(int team_size, int tiles, OprojEpilogue epilogue);

// The producer (grid (split, H / 64), clusters of split): the GEMM, its outputs
// pushed into every rank's slot [rank] (two-shot: into its owner's recv slot); then
// the consumer (grid (8, rows), clusters of 8): ArNorm's row body without the push,
// with the epilogue; two-shot: grid (8, min(rows, two_shot_clusters)), each cluster
// looping over rows: the owners' sums, the gather, the epilogue.
void launch_oproj_producer(const RankContext& ctx, cudaStream_t stream, const OprojParams& p);
void launch_oproj_consumer(const RankContext& ctx, cudaStream_t stream, const OprojParams& p, int two_shot_clusters);
// Both roles in one grid (oproj_fused.cu): oproj_fused_ctas(p) CTAs in clusters of
// 8; for at most kOprojFusedMaxTiles token tiles, (H / 64) · split a multiple of 8.
inline constexpr int kOprojFusedMaxTiles = 2;
int oproj_fused_ctas(const OprojParams& p);
void launch_oproj_fused(const RankContext& ctx, cudaStream_t stream, const OprojParams& p);
// The AttnRes epilogue alone on reduced rows y [rows, H] (the unfused path).
void launch_attn_res(cudaStream_t stream, bool pdl, const void* y, const AttnResTail& t, int rows, int hidden);

// Rows whose consumer grids every rank on ctx's GPU can hold at once.
int oproj_consumer_rows(const RankContext& ctx, OprojEpilogue epilogue, int64_t hidden);
// Clusters of the two-shot consumer every rank on ctx's GPU can hold at once.
int oproj_two_shot_clusters(const RankContext& ctx, OprojEpilogue epilogue, int64_t hidden);
// CTAs of the fused kernel (at `tiles` token tiles) that one rank may launch with
// every rank on ctx's GPU resident at once.
int oproj_fused_budget(const RankContext& ctx, OprojEpilogue epilogue, int tiles);

}  // namespace tpdecode
