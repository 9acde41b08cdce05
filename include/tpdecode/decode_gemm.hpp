// DecodeGemm: out[M, N] = x[M, K] * W[N, K]^T for one linear's weight, on the
// fastest measured path. For 1 <= M <= kGemmMaxRows (64) with contiguous,
// 16-byte-aligned operands and an eligible weight, the first eager call of an M
// bucket (gemm_m_bucket) times the candidates on the real weight -- the wgmma
// engine's tactics, the warp split-K engine at each split, cuBLAS's
// default and cuBLASLt's best few algorithms -- and keeps the fastest (GemmTuner:
// shared by the process, optionally on disk). Everything else runs cuBLAS. BF16
// operands, FP32 accumulation, one BF16 rounding; the engines' results are bitwise
// identical from run to run for a given decision. One object is called by one host
// thread at a time (a call may make its bucket's decision); different objects, and
// the tuner and cuBLAS context they share, may be called from several threads.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tpdecode/cublas_context.hpp"
#include "tpdecode/gemm_decision.hpp"
#include "tpdecode/gemm_tuner.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode {

class DecodeGemm {
 public:
  // `weight`: [N, K] bf16 on the current device; it must outlive this object.
  // A strided or misaligned weight is accepted and always runs on cuBLAS.
  // `cublas`: may be shared by every object of the device (it keeps a workspace per
  // stream); null makes a private one. `tuner`: null is GemmTuner::shared(). Construct
  // before any graph capture.
  explicit DecodeGemm(const TensorView& weight, std::shared_ptr<CublasContext> cublas = nullptr,
                      std::shared_ptr<GemmTuner> tuner = nullptr);
  ~DecodeGemm();
  DecodeGemm(const DecodeGemm&) = delete;
  DecodeGemm& operator=(const DecodeGemm&) = delete;

  int64_t n() const { return weight_.rows; }
  int64_t k() const { return weight_.cols; }
  const TensorView& weight() const { return weight_; }
  // An engine can run this weight (its shape, layout and alignment suit one).
  bool engine_eligible() const { return engines_.warp || engines_.wgmma; }

  // Decides m's bucket (from the tuner's cache, by timing the candidates, or by the
  // static rule; then the team's agreement, if set) and prepares its path (host
  // work: kernel attributes, workspace). Synchronises `stream` when it times. No-op
  // for an M the engines do not take or a bucket already decided. Throws
  // InvalidArgument while `stream` (if given) is capturing.
  void prepare(int m, cudaStream_t stream = nullptr);
  bool prepared(int m) const;
  // The decision of m's bucket (InvalidArgument unless prepared).
  const GemmDecision& decision(int m) const;
  // Runs `d` for m's bucket from now on (benchmarks, tests); InvalidArgument where
  // it cannot run this shape. Host only, never under capture.
  void force(int m, const GemmDecision& d);
  // What the tuner times for m rows: engine_candidates() plus cuBLASLt's heuristic
  // algorithms (host only).
  std::vector<GemmDecision> candidates(int m);
  // The GEMM's key in the tuner for m rows.
  GemmKey key(int m) const;

  // The path run() takes now for m rows with contiguous 16-byte-aligned operands:
  // the bucket's decision once prepared; before, what a call under capture takes
  // (the tuner's cached decision, else the static rule; cuBLAS where that path is
  // not prepared).
  GemmPath path(int m) const;
  // The path run() takes now for these operands (after the checks of run()).
  GemmPath path(const TensorView& x, const TensorView& out) const;

  // out[M, N] = x[M, K] * W^T on `stream`. x: [M, K] bf16, out: [M, N] bf16 (any
  // row stride >= cols; strided or misaligned operands run on cuBLAS, but in
  // batch-invariant mode, where 1 .. kGemmMaxRows rows must run its order:
  // InvalidArgument, as for an order not prepared on the current device). An eager
  // call prepares a new bucket (see prepare); a call under stream capture never
  // does. out may not overlap x or the weight, and the current device must be the
  // one it was built on (InvalidArgument). Returns the path taken.
  GemmPath run(const TensorView& x, const TensorView& out, cudaStream_t stream);

  // Programmatic dependent launch for the engines (default on): each engine kernel
  // lets the next kernel launch at its start, and requests its weights before
  // waiting for the previous one.
  void set_pdl(bool on) { pdl_ = on; }
  bool pdl() const { return pdl_; }
  // This GEMM is a link of a chain of PDL kernels (a decode step's graph): its
  // buckets are decided with stock candidates charged kChainBoundaryUs (what a stock
  // link costs its neighbours' overlap; gemm_tuner.hpp), under a key of their own.
  // Default off: a GEMM alone takes the fastest path alone. Changing it drops the
  // decisions made so far (the next eager call decides again).
  void set_chain(bool on);
  bool chain() const { return chain_; }
  // Links launched back to back with no other kernel between them (`links` in launch
  // order, each set_chain(true)): decides m's bucket of every link for the chain as a
  // whole. A link decided alone as a chain link charges a stock path kChainBoundaryUs
  // for the overlap it costs both neighbours; but a boundary overlaps only between two
  // PDL kernels, so an engine link between stock links buys nothing with it. Each link
  // is prepared as a chain link; where that took a PDL path, its bucket is also decided
  // alone (tuned and cached like any decision, agreed by a team); then every link takes
  // the option of the two with the least time for the chain: the links' measured times
  // plus kChainBoundaryUs / 2 per boundary with a non-PDL kernel on either side, the
  // chain's ends counting as PDL neighbours (src/gemm/adjacent_links.hpp). Where that
  // assignment, every such link's chain decision and every such link's decision alone
  // differ, the three are timed as the chain itself (one graph each, interleaved) and
  // the fastest kept: a link can cost neighbours of another shape more than the
  // model's boundary (src/gemm/chain_timing.hpp); not where a link has a team's
  // agreement (each rank would time its own) or tuning is off; a timing that fails
  // leaves the model's assignment, with a warning. Decisions not measured
  // (the static rule, forced, batch-invariant) stay as they are. Host only, never
  // under capture; synchronises `stream` when it times.
  static void decide_adjacent(const std::vector<DecodeGemm*>& links, int m, cudaStream_t stream = nullptr);
  // `ranks` ranks' GEMMs run on this GPU at once (a local team's driven ranks;
  // default 1): its buckets are decided under a key of their own, among the splits
  // warp_split_for_shared_gpu keeps. Changing it drops the decisions made so far
  // (a batch-invariant GEMM prepares its own again: then host only, on the GEMM's
  // device, never under capture).
  void set_sharing(int ranks);
  int sharing() const { return sharing_; }
  // Batch-invariant mode (default off): every row count 1 .. kGemmMaxRows runs one
  // summation order fixed for the shape, so a row's bits do not depend on how many
  // rows the call has (an engine, its CTA shape and split fix the order; token
  // tiles, ring and tile sizes, which each bucket keeps its own, do not change the
  // bits). `rows` (1 .. kGemmMaxRows; read when on), the row count the caller's
  // calls mostly have, picks the order: with tuning on, the fastest of
  // invariant_candidates timed at that row count's bucket (the wide and narrow warp
  // CTAs and the wgmma engine at every split; cached under a key of its own and
  // agreed by a team like other decisions); without, the static invariant_decision.
  // Calls far from the hint pay for it: an order fast at 8 rows ran 1.0-3.7 x the
  // default at 16-64, the narrow CTA up to 5.5 x (it runs calls above 16 rows as
  // launches of 16; docs/performance.md). Another hint decides again, so a row's bits may change
  // between hints, never between calls. Prepares every bucket now (host only, never
  // under capture; InvalidArgument where neither engine takes the weight; on any
  // error the mode is off); set_sharing prepares them again. Turning it off drops
  // the decisions. What engines' batch-invariant modes need; calls of more rows run
  // cuBLAS, so callers split them (the Python linear op does).
  void set_batch_invariant(bool on, int rows = kInvariantDefaultRows);
  static constexpr int kInvariantDefaultRows = 8;
  bool batch_invariant() const { return invariant_; }
  int batch_invariant_rows() const { return invariant_rows_; }  // the hint it was set with
  // A team's agreement (see gemm_tuner.hpp), called once per bucket at prepare.
  // With it set, an unprepared bucket under capture runs the static rule (the same
  // on every rank) rather than this rank's cache.
  void set_agreement(GemmAgreement agree) { agree_ = std::move(agree); }

 private:
  void check_operands(const TensorView& x, const TensorView& out) const;
  bool engine_takes(const TensorView& x) const;
  GemmKey key(int m, bool chain) const;
  // m's bucket decided as a chain link or alone (cached, timed or the static rule;
  // the team's agreement) and checked to run here; the rule where a cached one cannot.
  GemmDecision resolve(int m, bool chain, cudaStream_t stream);
  // The decision a call of m rows takes without preparing (under capture).
  GemmDecision unprepared_decision(int m) const;
  // The decision made runnable: cuBLAS where its path is not prepared here or the
  // operands do not suit it. `stored`: d is the bucket's decision (not an unprepared one).
  GemmPath runnable(const GemmDecision& d, const TensorView& x, const TensorView& out, bool stored) const;
  // Whether cuBLASLt runs d's algorithm on these operands (kept per row count for a
  // stored decision and contiguous operands).
  bool lt_runs(const GemmDecision& d, const TensorView& x, const TensorView& out, bool stored) const;
  void adopt(int m, GemmDecision d);  // validates, prepares and stores for m's bucket
  void forget_decisions();            // every bucket's, and what was verified of them
  // Every bucket's batch-invariant decision for the row hint, or (on an error) none
  // and the mode off.
  void adopt_invariant_decisions(int rows);
  // The summation order batch-invariant mode runs for calls mostly of `rows` rows:
  // the fastest of invariant_candidates at that bucket (tuned, cached, agreed by the
  // team as other decisions are), or the static invariant_decision.
  GemmDecision invariant_order(int rows);
  struct TileMaps;  // the weight's tensor maps for the wgmma engine (gemm_paths.hpp)

  TensorView weight_;
  std::shared_ptr<CublasContext> cublas_;
  std::shared_ptr<GemmTuner> tuner_;
  GemmAgreement agree_;
  GemmEngines engines_;
  bool pdl_ = true;
  bool chain_ = false;
  bool invariant_ = false;
  int invariant_rows_ = kInvariantDefaultRows;
  int sharing_ = 1;
  int device_ = 0;
  int sms_ = 0;
  std::string device_name_;
  std::array<std::optional<GemmDecision>, kGemmBuckets> decisions_{};
  // Per bucket, bit m - 1: cuBLASLt was found to run its decision for m contiguous rows.
  mutable std::array<uint64_t, kGemmBuckets> lt_verified_{};
  static_assert(kGemmMaxRows <= 64, "lt_verified_ has a bit per row count");
  std::unique_ptr<TileMaps> maps_;
};

}  // namespace tpdecode
