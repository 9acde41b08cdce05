// TpComm: the collectives of one team behind one object, the surface an engine
// calls. Every call takes the caller's CUDA streams, runs a mailbox kernel where it
// serves the call and the stock path (NCCL, or its local equivalent) otherwise, and
// returns which path ran and why. Mailbox epochs live on the device: no caller ever
// passes a parity, and any number of calls per CUDA graph, replayed back to back
// any number of times, is reuse-safe (src/comm/protocol.hpp has the argument).
//
// Contracts (every rank gets the same bits on the mailbox paths):
//  - all_reduce: BF16 partials summed in FP32 in rank order 0..TP-1, rounded once.
//  - ar_norm: that sum, plus the residual in FP32 rounded once (the new residual),
//    then RMSNorm of the new residual: rstd = 1/sqrt(sum of squares / H + eps),
//    out = BF16(v · rstd · w). The order of the sum of squares is documented in
//    src/comm/ar_norm.cu; the stock path uses the same norm kernel, so on the
//    local team both paths give the same bits (NCCL sums in its own order).
//  - The two-shot path (all_reduce, ar_norm) gives the one-shot's bits, except that
//    a reduced 32-bit word equal to 0x80000000 (a BF16 pair +0, -0) arrives as 0:
//    the sum crosses a mailbox (docs/protocol.md). CommConfig::batch_invariant
//    cleans the one-shot's and the stock path's sums the same way: every path then
//    gives the same bits, whatever the call's row count.
//  - ar_norm's FP8 epilogues (ArNormQuant): exactly the BF16 output quantised
//    (reference/fp8_quant.hpp).
//  - gather: bytes moved as they are, except that a 32-bit word equal to
//    0x80000000 (a BF16 pair +0, -0; an F32 -0) arrives as 0. I32 data is not
//    served by the mailbox (INT_MIN would change): it runs the stock path.
//
// Rules for callers:
//  - Build at load, collectively (every rank, same order), never during capture.
//    The ranks compare each mailbox's layout before allocating it: where a rank built
//    another config, every rank raises InvalidArgument naming it.
//  - The calls of one TpComm on one rank must be ordered (one stream, or streams
//    joined by events): the device-side epoch counts them.
//  - Calls must be made in the same order on every rank with the same shapes
//    (every rank then takes the same path).
//  - On the local team (one GPU plays N ranks) a call covers every driven rank:
//    spans of team.driven() entries. The NCCL team drives one rank: one entry, or
//    the single-rank overloads.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "tpdecode/team.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode {

// Hidden sizes ar_norm takes: the row norm runs 8 CTAs per row with 8 columns per
// thread and at most 256 threads per CTA, so multiples of 64 up to 16384.
inline constexpr int64_t kArNormMaxHidden = 16384;
constexpr bool ar_norm_hidden_served(int64_t hidden) {
  return hidden >= 64 && hidden % 64 == 0 && hidden <= kArNormMaxHidden;
}

// One rank's tensors of an all-reduce: bf16 [rows, width], contiguous, rows
// 16-byte aligned. out may alias x.
struct AllReduceIo {
  TensorView x;
  TensorView out;
};

// What ar_norm writes as its normalised output: BF16, or e4m3 (FP8) quantised in
// the same kernel. The e4m3 values are exactly the BF16 output quantised by
// reference/fp8_quant.hpp (which says where that differs from vLLM's quantisers):
//  - kStatic (vLLM's static-FP8 rms_norm): out = e4m3(v · (1 / scale)), scale an f32
//    [1, 1] tensor in device memory, read by the kernel (a graph replay reads its
//    current value);
//  - kGroup (vLLM's per_token_group_quant_fp8, group 128, row-major scales): per
//    128 columns scale = max(amax, 1e-10) / 448, out = e4m3(v / scale), the scales
//    written to an f32 [rows, hidden / 128] tensor;
//  - kGroupUe8m0: kGroup with each scale rounded up to a power of two (UE8M0: its
//    exponent byte is (bits >> 23) & 0xff of the f32 written).
// e4m3: round to nearest even, saturating at ±448; NaN stays NaN (a failed call's
// poisoned rows stay visibly poisoned, their group scales NaN too).
enum class ArNormQuant : uint8_t { kNone, kStatic, kGroup, kGroupUe8m0 };
const char* ar_norm_quant_name(ArNormQuant q);
inline constexpr int64_t kArNormQuantGroup = 128;
// Hidden sizes the group epilogues take: each group of 128 columns inside one of the
// 8 CTAs that hold a row (multiples of 1024).
constexpr bool ar_norm_group_quant_served(int64_t hidden) {
  return ar_norm_hidden_served(hidden) && hidden % (8 * kArNormQuantGroup) == 0;
}

// One rank's tensors of an all-reduce + residual add + RMSNorm (bf16 unless said,
// contiguous, rows 16-byte aligned).
struct ArNormIo {
  TensorView x;             // [rows, hidden]: this rank's partial
  TensorView residual;      // [rows, hidden], or data == nullptr: none (new residual = the sum)
  TensorView weight;        // [1, hidden]: the RMSNorm weight
  float eps = 1e-6f;        // finite, >= 0
  TensorView out;           // [rows, hidden]: RMSNorm(new residual) · weight (e4m3 when quantised)
  TensorView residual_out;  // [rows, hidden]: the new residual, bf16 always (may alias residual)
  ArNormQuant quant = ArNormQuant::kNone;
  TensorView scale;         // f32: kStatic [1, 1] (read); kGroup* [rows, hidden / 128] (written)
};

// One rank's tensors of a gather: shard [rows, S] of any dtype, out [rows, TP·S] of
// the same dtype (rank r's shard at columns r·S ...), contiguous, starting 16-byte
// aligned, rows a multiple of 4 bytes (the mailbox serves multiples of 16).
struct GatherIo {
  TensorView shard;
  TensorView out;
};

enum class CommPath : uint8_t {
  kOneShot,  // every rank pushes its partial to every rank (mailbox)
  kTwoShot,  // reduce-scatter to column owners, owners broadcast (mailbox)
  kStock,    // NCCL (NCCL team) or staging copies + a reduce kernel (local team)
};
const char* comm_path_name(CommPath path);

struct CommResult {
  CommPath path = CommPath::kStock;
  std::string why;  // why no mailbox path served the call ("" when one did)
};

// Which path all_reduce / ar_norm may take.
enum class CommAlgorithm : uint8_t {
  kAuto,     // the path that serves; where both do, the crossover table (src/comm/crossover.hpp); else stock
  kOneShot,  // one-shot where it serves, else stock
  kTwoShot,  // two-shot where it serves, else stock
  kStock,    // always the stock path
};

struct CommConfig {
  int64_t hidden = 7168;         // widest all_reduce / ar_norm row served (elements)
  int rows_cap = 64;             // rows per call on the mailbox paths
  int64_t gather_row_bytes = 0;  // widest gathered row (TP · shard bytes); 0: hidden · 2
  int parities = 2;              // 2, or 3 for callers that re-arm lazily (two-shot)
  CommAlgorithm algorithm = CommAlgorithm::kAuto;
  // Batch-invariant mode (what an engine's batch-invariant mode needs): a row's
  // output bits do not depend on the call's row count or on the path that ran.
  //  - all_reduce / ar_norm: every path gives clean(rank-order FP32 sum of the
  //    cleaned partials, rounded once), clean() turning a 32-bit word 0x80000000
  //    (+0, -0) into 0 as the mailbox does (so the one-shot gives the two-shot's
  //    bits, the documented exception included); the stock path sums the same way
  //    (the NCCL team gathers the partials with NCCL and sums them in rank order,
  //    instead of ncclAllReduce's order).
  //  - gather: sentinel words arrive as 0 on every path (i32 data, which the
  //    mailbox does not serve, is moved as it is on every path).
  //  - Where the stock path would run only because the mailbox paths do not hold
  //    that many rows, the call runs as further mailbox calls of as many rows as
  //    they hold (rows_cap, or what the GPU holds at once); rows above rows_cap are
  //    served the same way (not a CapacityError). The stock path runs only where no
  //    mailbox path serves the shape at all (TP 1, ranks apart), in calls of at most
  //    rows_cap rows.
  // The automatic choice then never picks the stock path where a mailbox path serves.
  bool batch_invariant = false;
  // A fence.acq_rel.sys in every pushing thread before its first push of an
  // all-reduce. Off: the kernel boundary already orders a rank's re-arms before its
  // next pushes (src/comm/protocol.hpp); kept to measure what the fence costs
  // (docs/performance.md) and for callers who want the belt and braces.
  bool system_fence = false;

  bool operator==(const CommConfig&) const = default;
};

class TpComm {
 public:
  // Collective over the team (every rank, same order); before any capture. On a
  // team whose ranks do not share memory, every call runs the stock path. Its
  // mailboxes (symmetric memory and 3 of the team's 255 epoch counters) belong to the
  // team and live as long as it does, whatever happens to this object: build a
  // TpComm once per team (a new team per reconfiguration), not per model reload
  // (the team's counters run out: CapacityError).
  explicit TpComm(Team& team, const CommConfig& config = {});
  ~TpComm();
  TpComm(const TpComm&) = delete;
  TpComm& operator=(const TpComm&) = delete;

  Team& team() const { return team_; }
  const CommConfig& config() const { return config_; }
  void set_algorithm(CommAlgorithm a) { config_.algorithm = a; }

  // One call for every driven rank: io[i] and streams[i] belong to driven rank i (a
  // stream of its own each; with two or more, none the legacy default stream).
  // Throws InvalidArgument (shapes, dtype, alignment, an output overlapping another
  // operand but for the in-place forms above: checked before anything is
  // launched), CapacityError (rows above the stock path's buffers) and TimeoutError
  // (the team is aborted: every rank must reset() it).
  CommResult all_reduce(std::span<const AllReduceIo> io, std::span<const cudaStream_t> streams);
  CommResult ar_norm(std::span<const ArNormIo> io, std::span<const cudaStream_t> streams);
  CommResult gather(std::span<const GatherIo> io, std::span<const cudaStream_t> streams);

  // The same for a team that drives one rank (the NCCL team).
  CommResult all_reduce(const AllReduceIo& io, cudaStream_t stream) { return all_reduce({&io, 1}, {&stream, 1}); }
  CommResult ar_norm(const ArNormIo& io, cudaStream_t stream) { return ar_norm({&io, 1}, {&stream, 1}); }
  CommResult gather(const GatherIo& io, cudaStream_t stream) { return gather({&io, 1}, {&stream, 1}); }

  // The path a call would take and why (nothing launched): for planning.
  CommResult plan_all_reduce(const AllReduceIo& io) const;
  CommResult plan_ar_norm(const ArNormIo& io) const;
  CommResult plan_gather(const GatherIo& io) const;

  class Impl;

 private:
  Team& team_;
  CommConfig config_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpdecode
