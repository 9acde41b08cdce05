// The GEMM context DecodeGemm runs its cuBLAS paths on: a cuBLAS and a cuBLASLt
// handle, and a workspace for each stream that calls it (made on that stream's first
// call, also under capture, and kept while the context lives). Objects on different
// streams may share one, also from several host threads (a call holds the context
// until it is queued). A graph's calls use the workspace of the stream they were
// captured on: graphs captured on one stream must not replay at once on two. A
// destroyed stream's workspace stays until the context goes: give a context to
// streams that live (the tuner keeps its timing streams for that reason).
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
  // Creates the handles on the current device; each stream's workspace has
  // `workspace_bytes` (0: none, which some cuBLASLt algorithms need).
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
  // The workspaces made so far (one per stream that called).
  std::size_t workspace_count() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpdecode
