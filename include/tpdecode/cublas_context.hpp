// A cuBLAS handle with its own workspace, set once before any graph capture.
// DecodeGemm runs its fallback on one. Objects that run concurrently on different
// streams must not share a context (the workspace is not stream-safe).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "tpdecode/tensor.hpp"

namespace tpdecode {

class CublasContext {
 public:
  // Creates the handle on the current device and a workspace of `workspace_bytes`.
  explicit CublasContext(std::size_t workspace_bytes = std::size_t{32} << 20);
  ~CublasContext();
  CublasContext(const CublasContext&) = delete;
  CublasContext& operator=(const CublasContext&) = delete;

  // out[M, N] = x[M, K] * w[N, K]^T: BF16 operands, FP32 compute, BF16 out.
  // Any row strides (multiples of nothing in particular) are accepted.
  void gemm(const TensorView& x, const TensorView& w, const TensorView& out, cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpdecode
