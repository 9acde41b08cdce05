// DecodeGemm: out[M, N] = x[M, K] * W[N, K]^T for one linear's weight. The warp
// split-K engine runs eligible shapes with 1 <= M <= 32 once M is prepared, where
// the tactic rule expects it to beat cuBLAS (GemmTactic::engine_preferred; or
// everywhere with GemmDispatch::kEngine); cuBLAS runs everything else. BF16
// operands, FP32 accumulation, one BF16 rounding; the engine's result is bitwise
// identical from run to run (cuBLAS's is not promised to be).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>

#include "tpdecode/cublas_context.hpp"
#include "tpdecode/gemm_tactic.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode {

enum class GemmPath : uint8_t { kWarpSplitK, kCublas };
const char* gemm_path_name(GemmPath p);  // "warp" / "cublas"

enum class GemmDispatch : uint8_t {
  kRule,    // the engine where the tactic rule expects it to beat cuBLAS (default)
  kEngine,  // the engine wherever it can run (tests, benchmarks)
};

class DecodeGemm {
 public:
  // `weight`: [N, K] bf16 on the current device; it must outlive this object.
  // A strided or misaligned weight is accepted and always runs on cuBLAS.
  // `cublas`: shared by objects that never run concurrently (e.g. one per stream);
  // null makes a private one. Construct before any graph capture.
  explicit DecodeGemm(const TensorView& weight, std::shared_ptr<CublasContext> cublas = nullptr);

  int64_t n() const { return weight_.rows; }
  int64_t k() const { return weight_.cols; }
  const TensorView& weight() const { return weight_; }
  // The weight's shape, layout and alignment suit the engine.
  bool engine_eligible() const { return eligible_; }

  // Prepares the engine for m rows (host work only: tactic, kernel attributes).
  // No-op where the engine does not take m. Throws InvalidArgument while `stream`
  // (if given) is capturing.
  void prepare(int m, cudaStream_t stream = nullptr);
  bool prepared(int m) const;
  // The tactic prepared for m (engine path only; InvalidArgument otherwise).
  const GemmTactic& tactic(int m) const;
  // Prepares m with a forced K split (benchmarks and tests of the tactic rule).
  void set_split(int m, int split);

  // The path run() takes now for m rows with contiguous 16-byte-aligned operands.
  // An M the rule leaves to cuBLAS is still prepared (tactic() answers for it).
  GemmPath path(int m) const;
  // The path run() takes now for these operands (after the checks of run()).
  GemmPath path(const TensorView& x, const TensorView& out) const;

  // out[M, N] = x[M, K] * W^T on `stream`. x: [M, K] bf16, out: [M, N] bf16 (any
  // row stride >= cols; strided or misaligned operands run on cuBLAS). An eager
  // call prepares the engine for a new M; a call under stream capture never does
  // (an unprepared M then runs on cuBLAS). Returns the path taken.
  GemmPath run(const TensorView& x, const TensorView& out, cudaStream_t stream);

  // Programmatic dependent launch for the engine (default on): its weight prefetch
  // overlaps the previous kernel's tail.
  void set_pdl(bool on) { pdl_ = on; }
  void set_dispatch(GemmDispatch d) { dispatch_ = d; }

 private:
  void check(const TensorView& x, const TensorView& out) const;
  bool engine_takes(const TensorView& x) const;
  bool engine_for(int64_t m) const;  // prepared, and the dispatch picks the engine

  TensorView weight_;
  std::shared_ptr<CublasContext> cublas_;
  bool eligible_ = false;
  bool pdl_ = true;
  GemmDispatch dispatch_ = GemmDispatch::kRule;
  int sms_ = 0;
  std::array<bool, kWarpMaxRows + 1> ready_{};
  std::array<GemmTactic, kWarpMaxRows + 1> tactics_{};
};

}  // namespace tpdecode
