// The drafter's lm_head path: the vocabulary-shard GEMM (DecodeGemm), the
// vocabulary gather (a caller-supplied collective), then one kernel that slices
// to the real vocabulary and applies the optional soft cap and scale.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>

#include "tpdecode/decode_gemm.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode {

// Gathers every rank's [M, S] shard into [M, TP*S] (rank r's shard at columns
// [r*S, (r+1)*S)) on `stream`: e.g. a TpComm gather, or NCCL's all-gather.
using LogitsGather = std::function<void(const TensorView& shard, const TensorView& gathered, cudaStream_t stream)>;

struct LogitsEpilogue {
  int64_t vocab = 0;      // real vocabulary size: out has this many columns
  float soft_cap = 0.0f;  // > 0: y = tanh(y / soft_cap) * soft_cap
  float scale = 1.0f;     // y *= scale (after the cap)
};

// hidden: [M, H] bf16; shard: [M, S] bf16 scratch (S = head.n()); gathered:
// [M, TP*S] bf16 scratch, or the shard view itself when `gather` is empty (TP 1);
// out: [M, vocab] bf16, vocab <= gathered columns. All buffers are the caller's
// (allocate them before any capture); the call is graph-capturable.
// Rounding: the GEMM rounds once to BF16 (as cuBLAS); the epilogue reads that
// BF16 value, computes cap and scale in FP32 (tanhf) and rounds once more to BF16.
// With no cap and scale 1 the epilogue is an exact copy.
// InvalidArgument, before anything is launched: a buffer of another shape or dtype,
// out over any other operand (or gathered over hidden), a cap or scale that is not
// finite (a cap must be >= 0), more than 65535 rows.
void draft_logits(DecodeGemm& head, const TensorView& hidden, const TensorView& shard, const LogitsGather& gather,
                  const TensorView& gathered, const LogitsEpilogue& epilogue, const TensorView& out,
                  cudaStream_t stream);

}  // namespace tpdecode
