// Launchers of the drafter step's own kernels (kernels.cu), shared by the stock and
// specialised paths. Arguments are checked by the caller (gpu_step_ops.cpp).
// `pdl`: launch with programmatic dependent launch (every kernel here waits for its
// predecessor with griddepcontrol.wait before reading anything).
// (No fmt here: included by kernels.cu.)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "drafter/weights.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode::drafter {

// Fills a [map.rows, map.cols] bf16 shard (contiguous) with its hash values.
void launch_fill(cudaStream_t stream, void* out, const FillSpec& spec);

// out[m, :] = table[tokens[m] - vocab0, :] when vocab0 <= tokens[m] < vocab0 +
// table_rows, else zeros. table: [table_rows, hidden]; out: [M, hidden].
void launch_embed(cudaStream_t stream, const int32_t* tokens, const TensorView& table, int64_t vocab0,
                  const TensorView& out, bool pdl);

// One RMSNorm: out = BF16(x · rstd · w) per row (order: kernels.cuh); x may be strided.
struct NormView {
  TensorView x;
  const void* weight;
  TensorView out;
};
// Up to kernels::kMaxNorms norms of inputs with the same rows, in one launch.
void launch_rms_norms(cudaStream_t stream, std::span<const NormView> norms, float eps, bool pdl);

struct AttentionShape {
  int heads = 0;  // local heads
  int head0 = 0;  // global index of local head 0
  int nope = 0, rope = 0, v_head = 0, kv_lora = 0;
};
// The attention stand-in of step.hpp. q: [M, heads·(nope+rope)], kv: [M, kv_lora],
// k_rope: [M, rope], out: [M, heads·v_head].
void launch_attention(cudaStream_t stream, const TensorView& q, const TensorView& kv, const TensorView& k_rope,
                      const TensorView& out, const AttentionShape& shape, bool pdl);

// out = BF16(a + b).
void launch_add(cudaStream_t stream, const TensorView& a, const TensorView& b, const TensorView& out, bool pdl);

// tokens[m] = the lowest index of row m's largest logit (NaN never wins).
void launch_argmax(cudaStream_t stream, const TensorView& logits, int32_t* tokens, bool pdl);

}  // namespace tpdecode::drafter
