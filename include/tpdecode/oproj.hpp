// PreparedOproj: a decoder layer's row-parallel o-projection fused with its TP
// all-reduce and the epilogue after it (docs/oproj.md).
//
// Unfused, the o-projection is a GEMM writing this rank's partial [M, H] to memory
// and an all-reduce kernel reading it back and pushing it to the peers. Here the
// GEMM's epilogue rounds each output fragment once to BF16 and stores it straight
// into slot [rank] of every rank's mailbox (peer stores, never multicast); a
// consumer polls its TP slots, sums them in rank order and runs the epilogue:
//  - kArNorm: residual add + RMSNorm, the outputs and bits of TpComm::ar_norm on
//    the same partials (the same kernel body and summation order);
//  - kAttnRes: Block Attention Residuals (src/oproj/attn_res.cuh has the math and
//    its summation orders; reference/attn_res.hpp the CPU reference).
//
// Kinds (which one runs is the rule table's measured choice, or forced):
//  - kUnfused: DecodeGemm + TpComm (ar_norm; or all_reduce + the AttnRes kernel);
//  - kProducerConsumer: the pushing GEMM, then a consumer kernel of 8-CTA clusters;
//  - kFused: one kernel holding both roles (producers never wait on consumers);
//    served only where every rank's whole grid can be resident at once;
//  - kTwoShot: the producer pushes each fragment to its column's owner only; the
//    owners sum and broadcast (the two-shot all-reduce's primitives), then each
//    rank gathers its rows and runs the epilogue.
// The GEMM partials are the warp split-K engine's at one split (producer_split():
// the unfused path's DecodeGemm decision where that is the warp engine, else
// choose_tactic's), so every kind but kUnfused gives the same bits (two-shot:
// except a reduced word equal to the sentinel, which arrives as 0), and kUnfused
// too where DecodeGemm runs the warp engine with its wide CTAs (its narrow ones sum
// in another order).
//
// Rules for callers: those of TpComm (build collectively at load, never during
// capture; calls ordered on one stream per rank, same order and shapes on every
// rank). Layers share one OprojMailbox: its device-side epoch alternates the parity
// by use, so no caller passes one.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tpdecode/comm.hpp"
#include "tpdecode/cublas_context.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode {

enum class OprojEpilogue : uint8_t {
  kArNorm,   // residual add + RMSNorm (TpComm::ar_norm's contract)
  kAttnRes,  // Block Attention Residuals
};
const char* oproj_epilogue_name(OprojEpilogue e);  // "ar_norm", "attn_res"

enum class OprojKind : uint8_t { kUnfused, kProducerConsumer, kFused, kTwoShot };
const char* oproj_kind_name(OprojKind k);  // "unfused", "producer-consumer", "fused", "two-shot"

struct OprojResult {
  OprojKind kind = OprojKind::kUnfused;
  std::string why;  // why the asked-for or the rule's kind did not run ("" when it did)
};

// Most saved blocks the AttnRes epilogue takes (its per-thread registers).
inline constexpr int kAttnResMaxBlocks = 16;

// One rank's tensors of an o-projection + all-reduce + residual + RMSNorm (bf16,
// contiguous, 16-byte aligned rows; M rows).
struct OprojArNormIo {
  TensorView x;             // [M, K]: this rank's attention output (its heads)
  TensorView residual;      // [M, H], or data == nullptr: none
  TensorView weight;        // [1, H]: the RMSNorm weight
  float eps = 1e-6f;
  TensorView out;           // [M, H]: RMSNorm(new residual) · weight
  TensorView residual_out;  // [M, H]: the new residual (may alias residual)
};

// The next layer's AttnRes statistics over the saved blocks (bind_ahead): per row
// the largest logit m and Σ exp(s_i - m) (stats), and Σ exp(s_i - m) · v_i
// (mixture), with the next layer's key norm and query; that layer then merges
// only its own partial (reference/attn_res.hpp: attn_res_merge).
struct AttnResAhead {
  TensorView key_norm;  // [1, H] bf16: the next layer's g
  TensorView query;     // [1, H] bf16: the next layer's q
  float eps = 1e-6f;
  TensorView stats;     // [M, 2] f32
  TensorView mixture;   // [M, H] f32
};

// One rank's tensors of an o-projection + all-reduce + Block Attention Residuals.
struct OprojAttnResIo {
  TensorView x;            // [M, K] bf16
  TensorView partial;      // [M, H] bf16: the block's partial sum p (read unless new_block)
  TensorView partial_out;  // [M, H] bf16: p' (may alias partial)
  TensorView blocks;       // [nb · M, H] bf16: saved block i's rows at [i·M, (i+1)·M); nb = blocks.rows / M
  bool new_block = false;  // this layer starts a block: p' = y
  TensorView key_norm;     // [1, H] bf16: g
  TensorView query;        // [1, H] bf16: q (the pseudo-query)
  TensorView out_norm;     // [1, H] bf16: w
  float eps = 1e-6f;
  TensorView out;          // [M, H] bf16
  std::optional<AttnResAhead> ahead;
};

// The mailboxes every layer's PreparedOproj shares: [2 parities, TP, rows_cap, H]
// bf16 (one-shot) and the two-shot pair (recv [2, TP, rows_cap, H / TP], gather
// [2, 1, rows_cap, H]), sentinel-armed symmetric memory, one epoch counter each.
// Collective over the team; before any capture. Where the ranks do not share
// memory it holds nothing. Its memory and epoch counters belong to the team and
// live as long as it does (as TpComm's): build it once per team.
class OprojMailbox {
 public:
  OprojMailbox(Team& team, int rows_cap = 64, int64_t hidden = 7168);
  ~OprojMailbox();
  OprojMailbox(const OprojMailbox&) = delete;
  OprojMailbox& operator=(const OprojMailbox&) = delete;
  int rows_cap() const { return rows_cap_; }
  int64_t hidden() const { return hidden_; }

 private:
  friend class PreparedOproj;
  class Impl;
  int rows_cap_;
  int64_t hidden_;
  std::unique_ptr<Impl> impl_;
};

struct OprojOptions {
  std::vector<int> rows;          // row counts to prepare at construction (others: prepare())
  std::optional<OprojKind> kind;  // force a kind where it serves (else kUnfused, with why); empty: the rule table
  // The unfused path's GEMM context per driven rank (one of that rank's device, which
  // the caller's other GEMMs may share); empty: a private one per driven rank.
  std::vector<std::shared_ptr<CublasContext>> cublas;
};

class PreparedOproj {
 public:
  // weights[i]: driven rank i's o_proj shard [H, K] bf16 (contiguous, 16-byte
  // aligned; it must outlive this object). `comm` holds H columns (InvalidArgument
  // otherwise); more rows than `comm` holds where they run unfused (the kind that
  // uses `comm`) raise CapacityError: at prepare where the plan is unfused, and in a
  // call before anything is queued (a kind set since). Collective
  // (every rank, same order); before any capture.
  PreparedOproj(TpComm& comm, std::shared_ptr<OprojMailbox> mailbox, std::span<const TensorView> weights,
                OprojEpilogue epilogue, const OprojOptions& options = {});
  ~PreparedOproj();
  PreparedOproj(const PreparedOproj&) = delete;
  PreparedOproj& operator=(const PreparedOproj&) = delete;

  OprojEpilogue epilogue() const;
  int64_t hidden() const;
  int64_t k() const;
  void set_kind(std::optional<OprojKind> kind);

  // Host preparation for m rows (kernel attributes, the GEMM split, the unfused
  // path's DecodeGemm); eager only (InvalidArgument while a team stream captures).
  void prepare(int m);
  bool prepared(int m) const;
  // The kind a call of m rows takes and why (nothing launched).
  OprojResult plan(int m) const;
  // The warp split-K split of the producer for m rows (the GEMM's K order).
  int producer_split(int m) const;

  // One call for every driven rank (io[i], streams[i]: driven rank i). Throws
  // InvalidArgument (shapes, dtypes, alignment, an output over another operand but
  // for the in-place forms above, the wrong epilogue, m not prepared while a team
  // stream or a stream of the call captures, one stream for two driven ranks),
  // TimeoutError (the team is aborted: every rank must reset()), TeamBroken (the
  // team is broken()).
  OprojResult run(std::span<const OprojArNormIo> io, std::span<const cudaStream_t> streams);
  OprojResult run(std::span<const OprojAttnResIo> io, std::span<const cudaStream_t> streams);
  OprojResult run(const OprojArNormIo& io, cudaStream_t stream) { return run({&io, 1}, {&stream, 1}); }
  OprojResult run(const OprojAttnResIo& io, cudaStream_t stream) { return run({&io, 1}, {&stream, 1}); }

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpdecode
