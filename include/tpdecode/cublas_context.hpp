// The per-stream GEMM context: a cuBLAS and a cuBLASLt handle with their own
// workspace, set once before any graph capture. DecodeGemm runs its cuBLAS paths on
// one. Objects that run concurrently on different streams must not share a context
// (the workspace is not stream-safe); calls on one stream may share it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "tpdecode/gemm_decision.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode {

class CublasContext {
 public:
  // Creates the handles on the current device and a workspace of `workspace_bytes`.
  explicit CublasContext(std::size_t workspace_bytes = std::size_t{32} << 20);
  ~CublasContext();
  CublasContext(const CublasContext&) = delete;
  CublasContext& operator=(const CublasContext&) = delete;

  // out[M, N] = x[M, K] * w[N, K]^T: BF16 operands, FP32 compute, BF16 out, with
  // cuBLAS's default algorithm (cublasGemmEx). Any row strides are accepted, sizes and
  // strides up to 2^31 - 1 (InvalidArgument above: its 32-bit arguments).
  void gemm(const TensorView& x, const TensorView& w, const TensorView& out, cudaStream_t stream);

  // The same product with cublasLtMatmul and a given algorithm.
  void gemm_lt(const TensorView& x, const TensorView& w, const TensorView& out, const CublasLtAlgo& algo,
               cudaStream_t stream);
  // Up to `count` algorithms cuBLASLt's heuristic proposes for these operands, best
  // first, that fit the workspace and keep FP32 accumulation with one rounding
  // (split-K reductions in FP32 only). Host only.
  std::vector<CublasLtAlgo> lt_algorithms(const TensorView& x, const TensorView& w, const TensorView& out,
                                          int count);
  // Whether `algo` runs these operands on this GPU and cuBLASLt (a cached or
  // agreed decision is checked before use).
  bool lt_algorithm_ok(const TensorView& x, const TensorView& w, const TensorView& out, const CublasLtAlgo& algo);
  // e.g. "algo 21 tile 18 split-K 4 (fp32 reduction)".
  static std::string describe_lt(const CublasLtAlgo& algo);
  // "<major>.<minor>.<patch>" of the cuBLASLt library loaded.
  static std::string lt_version();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpdecode
