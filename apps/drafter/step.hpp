// One drafter decode step, written once over a small interface of ops (StepOps)
// that three backends implement: the GPU stock path, the GPU specialised path
// (gpu_drafter.hpp) and the CPU reference (cpu_reference.hpp).
//
// Per rank, for M rows (R requests · k draft tokens):
//  1. embedding partial (vocabulary-parallel) → all-reduce without residual, fused
//     with layer 0's input RMSNorm (the new residual is the reduced embedding);
//  2. per layer: fused_qkv_a → q_a RMSNorm → q_b → q; kv latent RMSNorm; the
//     attention stand-in; o_proj → all-reduce + residual + post-attention RMSNorm;
//     gate_up → SiLU(gate)·up → down → all-reduce + residual + the next layer's
//     input RMSNorm (the final norm after the last layer);
//  3. context projection (column-parallel) → gather; added to the final hidden;
//  4. lm_head (vocabulary-parallel) → logits gather → argmax (lowest index on ties).
// 1 + 2·layers all-reduces and, at TP > 1, 2 gathers. At TP 1 the gathers are
// identities (the GEMMs write the gathered buffers directly) and each all-reduce is
// its RMSNorm alone.
//
// The vocabulary is a multiple of TP·8, so the gathered logits are exactly the
// vocabulary (no slice) and there is no soft cap: draft_logits' epilogue would be a
// copy, so the step runs its two parts (shard GEMM, logits gather) as separate ops,
// which also lets the breakdown time them separately.
//
// Attention stand-in (attention is outside tpdecode's scope; cheap, deterministic, and a
// function of q and kv): for row m, local head h (global head g = rank·heads/TP + h),
// d < v_head:
//   s[m, h] = Σ_i q[m, h, nope + i] · k_rope[m, i] over i = 0 .. rope-1, an FP32 fma
//             chain in i order;
//   attn[m, h, d] = BF16(fma(q[m, h, d], kv[m, (g · v_head + d) mod kv_lora], s / 8)),
// with kv the normed kv latent and k_rope the raw rope columns of fused_qkv_a.
#pragma once

#include <cstdint>
#include <span>

#include "drafter/config.hpp"
#include "drafter/weights.hpp"

namespace tpdecode::drafter {

// The step's activation buffers; each is [rows, buffer_cols(...)] bf16 per rank.
enum class Buf : int {
  kPartial,       // [M, hidden] embedding / o_proj / down partial
  kResidual,      // [M, hidden]
  kHidden,        // [M, hidden] normed hidden
  kQkvA,          // [M, qkv_a]: q_a | kv latent | k_rope
  kQa,            // [M, q_lora] normed q_a
  kQ,             // [M, heads/TP · qk_head]
  kKv,            // [M, kv_lora] normed kv latent
  kAttn,          // [M, heads/TP · v_head]
  kGateUp,        // [M, 2 · intermediate/TP]: gate | up
  kAct,           // [M, intermediate/TP]
  kContextIn,     // [M, context_in]
  kContextShard,  // [M, hidden/TP]
  kContext,       // [M, hidden] gathered context projection
  kHeadIn,        // [M, hidden] final hidden + context
  kLogitsShard,   // [M, vocab/TP]
  kLogits,        // [M, vocab]
  kCount
};
int64_t buffer_cols(const DrafterConfig& config, const RankShapes& shapes, Buf buf);
const char* buffer_name(Buf buf);

// Columns [col0, col0 + cols) of the first M rows of a buffer.
struct Slice {
  Buf buf = Buf::kPartial;
  int64_t col0 = 0;
  int64_t cols = 0;
};

enum class GatherKind { kContext, kLogits };

// One local RMSNorm of every row of x, weighted by `weight`, into out.
struct RowNorm {
  Slice x;
  WeightId weight;
  Slice out;
};

// The ops of one step, each for every rank the backend drives. Rows: the step's M.
class StepOps {
 public:
  virtual ~StepOps() = default;
  // This rank's vocabulary-parallel embedding partial of the step's tokens (zero
  // rows for tokens outside its range).
  virtual void embed(const Slice& out) = 0;
  // out = x · Wᵀ for this rank's shard of `weight`.
  virtual void gemm(WeightId weight, const Slice& x, const Slice& out) = 0;
  // All-reduce of `partial` over the team (+ the residual buffer unless
  // `first`), the sum written to the residual buffer, RMSNorm(·) · norm into out.
  virtual void ar_norm(const Slice& partial, bool first, WeightId norm, const Slice& out) = 0;
  // The o-projection and the all-reduce + residual + RMSNorm after it: partial =
  // x · Wᵀ, then ar_norm(partial, false, norm, out). A backend with the fused
  // o-projection (PreparedOproj) runs both in one; by default the two ops above
  // (the partial is then written; a fused kind need not write it).
  virtual void oproj_ar_norm(WeightId weight, const Slice& x, const Slice& partial, WeightId norm, const Slice& out) {
    gemm(weight, x, partial);
    ar_norm(partial, false, norm, out);
  }
  // Independent local RMSNorms (kernels.cuh documents the summation order); a GPU
  // backend runs them in one launch, one kernel boundary fewer per layer.
  virtual void rms_norms(std::span<const RowNorm> norms) = 0;
  virtual void attention(const Slice& q, const Slice& kv, const Slice& k_rope, const Slice& out) = 0;
  // out[:, j] = BF16(SiLU(gate[:, j]) · up[:, j]) in FP32; gate_up = gate | up.
  virtual void silu_mul(const Slice& gate_up, const Slice& out) = 0;
  virtual void gather(GatherKind kind, const Slice& shard, const Slice& out) = 0;
  // out = BF16(a + b) in FP32.
  virtual void add(const Slice& a, const Slice& b, const Slice& out) = 0;
  // The step's draft tokens: per row, the lowest index of the largest logit.
  virtual void argmax(const Slice& logits) = 0;
};

// Which ops run (the breakdown times graphs of op subsets).
enum class OpKind { kGemm, kCollective, kOther };
struct OpFilter {
  bool gemm = true, collective = true, other = true;
  bool runs(OpKind k) const { return k == OpKind::kGemm ? gemm : k == OpKind::kCollective ? collective : other; }
  static OpFilter only(OpKind k) { return {k == OpKind::kGemm, k == OpKind::kCollective, k == OpKind::kOther}; }
};

// Runs one step's op sequence (1 + 2·layers all-reduces: an odd number, which the
// comm object's device-side epochs make safe to capture and replay back to back).
void run_step(const DrafterConfig& config, const RankShapes& shapes, StepOps& ops, const OpFilter& filter = {});

struct StepOpCounts {
  int gemms = 0, ar_norms = 0, gathers = 0, norms = 0, others = 0;
  // Bytes of the weights one rank's ops read, each once: its GEMM shards and the
  // norm weights. Not the embedding: its lookup reads only the rows of the step's
  // tokens (at most M), and leaving them out keeps a floor made from this a lower bound.
  int64_t weight_bytes = 0;
};
// The op sequence's counts at team size tp.
StepOpCounts count_step_ops(const DrafterConfig& config, int tp);

}  // namespace tpdecode::drafter
