// One o-projection call's data on every rank of a team, drawn from a seed (every
// thread of an NCCL team draws the same), the driven ranks' device buffers and
// call arguments, and the CPU references:
//  - from FP64 partials (reference::gemm_bf16_rounded per rank), the exact
//    reference: compared within a stated tolerance;
//  - from the GPU's own partials (the warp split-K engine at the producer's split,
//    run on this thread's GPU for every rank): compared bitwise (the new residual,
//    p'), or within 1 BF16 ulp (the normalised outputs).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "gpu/gpu_test_util.hpp"
#include "reference/ar_norm.hpp"
#include "reference/attn_res.hpp"
#include "tpdecode/oproj.hpp"

namespace tpdecode::test {

struct OprojShapeArgs {
  int m = 1;
  int64_t hidden = 1024;
  int64_t k = 256;
  OprojEpilogue epilogue = OprojEpilogue::kArNorm;
  int nb = 0;              // AttnRes: saved blocks
  bool new_block = false;  // AttnRes
  bool ahead = false;      // AttnRes: bind_ahead
};

// What a call wrote on one driven rank (BF16 bits; f32 for bind_ahead).
struct OprojOutputs {
  std::vector<uint16_t> first;   // ArNorm: the new residual; AttnRes: p'
  std::vector<uint16_t> out;     // the normalised rows
  std::vector<float> stats, mixture;
  bool operator==(const OprojOutputs&) const = default;
};

class OprojCase {
 public:
  OprojCase(const Team& team, const OprojShapeArgs& shape, uint64_t seed);

  const OprojShapeArgs& shape() const { return s_; }
  // Driven ranks' weights, for PreparedOproj.
  std::vector<TensorView> weights() const;
  // Runs `op` on every driven rank's streams (outputs poisoned first).
  OprojResult run(PreparedOproj& op);
  // Fresh activations from `seed` into the same buffers (graph replays); the
  // references are recomputed.
  void refill_x(const Team& team, uint64_t seed);
  const std::vector<OprojArNormIo>& ar_norm_io() const { return ar_io_; }
  const std::vector<OprojAttnResIo>& attn_res_io() const { return attn_io_; }

  OprojOutputs outputs(int driven) const;
  // The saved blocks [nb, m, hidden] and the next layer's AttnRes weights (g', q';
  // this layer's w), for bind_ahead checks.
  const std::vector<uint16_t>& blocks() const { return blocks_; }
  reference::AttnResWeights next_weights() const { return {g_next_, q_next_, w_out_, 1e-6f}; }
  // The reference from FP64 partials.
  OprojOutputs fp64_reference() const;
  // The reference from the warp engine's partials at `split` (every rank's
  // computed on this thread's GPU).
  OprojOutputs gpu_partials_reference(int split) const;

  // Device buffers of driven rank i's outputs (in-graph checks).
  const DeviceBuffer& first_buffer(int driven) const { return first_[static_cast<std::size_t>(driven)]; }
  std::size_t rows_elements() const { return static_cast<std::size_t>(s_.m * s_.hidden); }

 private:
  OprojOutputs reference_from(const std::vector<std::vector<uint16_t>>& partials) const;
  void draw_x(uint64_t seed);

  OprojShapeArgs s_;
  int ranks_;
  std::vector<std::vector<uint16_t>> x_, w_;  // every rank's
  std::vector<uint16_t> residual_, norm_, partial_, blocks_, g_, q_, w_out_, g_next_, q_next_;
  // Inputs shared by the driven ranks (replicated, read-only) and per-rank buffers.
  DeviceBuffer residual_d_, norm_d_, partial_d_, blocks_d_, g_d_, q_d_, w_out_d_, g_next_d_, q_next_d_;
  std::vector<DeviceBuffer> x_d_, w_d_, first_, out_, stats_, mixture_;
  std::vector<OprojArNormIo> ar_io_;
  std::vector<OprojAttnResIo> attn_io_;
  std::vector<cudaStream_t> streams_;
  int device_ = 0;
};

// Elements of `got` more than `ulps` BF16 ulps from `want` (NaN counts). With a
// scale > 0, an element also passes within `ulps` ulps of `scale` (absolute): why,
// an output computed with FP32 transcendentals (the AttnRes softmax) that is a
// near-cancelling sum lies close to zero, where a difference far below the row's
// magnitude is many ulps (once in many fresh seeds: 2 ulps on one of 3072 values).
int count_beyond(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, int ulps, float scale = 0.0f);
// Every element a NaN (a poisoned output).
bool all_nan(const std::vector<uint16_t>& v);

}  // namespace tpdecode::test
