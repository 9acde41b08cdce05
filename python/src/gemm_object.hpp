// tpdecode.DecodeGemm on the Python side: one linear's weight and its engines.
#pragma once

#include <tvm/ffi/object.h>
#include <tvm/ffi/string.h>

#include <memory>

#include "tensor_args.hpp"
#include "tpdecode/decode_gemm.hpp"

namespace tpdecode::python {

class DecodeGemmObj : public tvm::ffi::Object {
 public:
  int64_t n = 0;
  int64_t k = 0;
  int64_t device = 0;
  bool engine_eligible = false;

  // `weight` [N, K] bf16 (the caller keeps it alive). `shared_cublas`: one cuBLAS
  // context per device for every such object (a 32 MB workspace per stream); else
  // a private one (its own workspaces).
  DecodeGemmObj(DLView weight, bool shared_cublas);

  // Host work only; ValueError under stream capture.
  void prepare(int64_t m);
  bool prepared(int64_t m) const { return gemm_->prepared(static_cast<int>(m)); }
  // The path (GemmPath, decode_gemm.hpp) run() takes now for m contiguous rows.
  int64_t path(int64_t m) const;
  tvm::ffi::String decision(int64_t m) const;
  // out = x · Wᵀ on the caller's stream; returns the GemmPath taken.
  int64_t run(DLView x, DLView out);
  // DecodeGemm::set_chain / chain (decode_gemm.hpp): decisions for a link of a
  // chain of PDL kernels; changing it drops the decisions made so far.
  void set_chain(bool on);
  bool chain() const { return gemm_->chain(); }
  void set_batch_invariant(bool on, int64_t rows);
  bool batch_invariant() const { return gemm_->batch_invariant(); }
  int64_t batch_invariant_rows() const { return gemm_->batch_invariant_rows(); }

  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("tpdecode.DecodeGemm", DecodeGemmObj, tvm::ffi::Object);

 private:
  std::unique_ptr<DecodeGemm> gemm_;
};

}  // namespace tpdecode::python
