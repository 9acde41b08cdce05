#include "gemm_object.hpp"

#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "errors.hpp"

namespace tpdecode::python {
namespace {

// One cuBLAS context per device, kept while any DecodeGemm uses it.
std::shared_ptr<CublasContext> shared_cublas_for(int device) {
  static std::mutex mutex;
  static std::map<int, std::weak_ptr<CublasContext>> contexts;
  std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<CublasContext> c = contexts[device].lock();
  if (!c) {
    c = std::make_shared<CublasContext>();
    contexts[device] = c;
  }
  return c;
}

}  // namespace

DecodeGemmObj::DecodeGemmObj(DLView weight, bool shared_cublas) {
  translated([&] {
    if (weight.ndim() != 2) raise(kind::kValue, "DecodeGemm: weight must be 2-D [N, K]");
    const DLDevice d = weight.device();
    device = d.device_type == kDLCUDA ? d.device_id : 0;
    const TensorView w = bf16_matrix(weight, static_cast<int>(device), "DecodeGemm: weight");
    DeviceScope scope(static_cast<int>(device));
    gemm_ = std::make_unique<DecodeGemm>(w, shared_cublas ? shared_cublas_for(static_cast<int>(device)) : nullptr);
    n = gemm_->n();
    k = gemm_->k();
    engine_eligible = gemm_->engine_eligible();
  });
}

void DecodeGemmObj::prepare(int64_t m) {
  translated([&] {
    DeviceScope scope(static_cast<int>(device));
    gemm_->prepare(static_cast<int>(m), current_stream(static_cast<int>(device)));
  });
}

int64_t DecodeGemmObj::path(int64_t m) const {
  return translated([&] { return static_cast<int64_t>(gemm_->path(static_cast<int>(m))); });
}

tvm::ffi::String DecodeGemmObj::decision(int64_t m) const {
  return translated([&] { return tvm::ffi::String(describe(gemm_->decision(static_cast<int>(m)))); });
}

int64_t DecodeGemmObj::run(DLView x, DLView out) {
  return translated([&] {
    const int dev = static_cast<int>(device);
    const TensorView xv = bf16_matrix(x, dev, "DecodeGemm: x");
    const TensorView ov = bf16_matrix(out, dev, "DecodeGemm: out");
    DeviceScope scope(dev);
    return static_cast<int64_t>(gemm_->run(xv, ov, current_stream(dev)));
  });
}

void DecodeGemmObj::set_chain(bool on) {
  translated([&] { gemm_->set_chain(on); });
}

void DecodeGemmObj::set_batch_invariant(bool on, int64_t rows) {
  translated([&] {
    DeviceScope scope(static_cast<int>(device));
    // Why the clamp: a value outside 1..64 stays outside it (and is refused) once narrowed.
    gemm_->set_batch_invariant(on, static_cast<int>(std::clamp<int64_t>(rows, 0, kGemmMaxRows + 1)));
  });
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::ObjectDef<DecodeGemmObj>(refl::init(false))
      .def_ro("n", &DecodeGemmObj::n)
      .def_ro("k", &DecodeGemmObj::k)
      .def_ro("device", &DecodeGemmObj::device)
      .def_ro("engine_eligible", &DecodeGemmObj::engine_eligible)
      .def("prepare", &DecodeGemmObj::prepare)
      .def("prepared", &DecodeGemmObj::prepared)
      .def("path", &DecodeGemmObj::path)
      .def("decision", &DecodeGemmObj::decision)
      .def("set_chain", &DecodeGemmObj::set_chain)
      .def("chain", &DecodeGemmObj::chain)
      .def("set_batch_invariant", &DecodeGemmObj::set_batch_invariant)
      .def("batch_invariant", &DecodeGemmObj::batch_invariant)
      .def("batch_invariant_rows", &DecodeGemmObj::batch_invariant_rows)
      .def("decode_gemm", &DecodeGemmObj::run);
}

}  // namespace tpdecode::python
