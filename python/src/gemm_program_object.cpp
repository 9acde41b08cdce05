#include "gemm_program_object.hpp"

#include <tvm/ffi/reflection/registry.h>

#include "errors.hpp"
#include "program_ops.hpp"

namespace tpdecode::python {

int GemmProgramObj::set_device(const DLView& x) {
  const DLDevice d = x.device();
  if (device < 0) {
    if (d.device_type != kDLCUDA) raise(kind::kValue, "GemmProgram: the first op's x must be a CUDA tensor");
    device = d.device_id;
  }
  if (program_) raise(kind::kValue, "GemmProgram: ops are added before build()");
  return static_cast<int>(device);
}

void GemmProgramObj::add_gemm(DLView weight, DLView x, DLView out, int64_t after, bool silu_mul) {
  translated([&] {
    const int dev = set_device(x);
    pending_.push_back(program_gemm("GemmProgram", dev, weight, x, out, after, silu_mul));
    ops = static_cast<int64_t>(pending_.size());
  });
}

void GemmProgramObj::add_norm(DLView x, int64_t after, DLView weight, double eps,
                              tvm::ffi::Optional<DLView> residual, tvm::ffi::Optional<DLView> residual_out,
                              DLView out, bool folded, bool all_reduce) {
  translated([&] {
    const int dev = set_device(x);
    pending_.push_back(
        program_norm("GemmProgram", dev, x, after, weight, eps, residual, residual_out, out, folded, all_reduce));
    ops = static_cast<int64_t>(pending_.size());
  });
}

void GemmProgramObj::build(int64_t m) {
  translated([&] {
    if (program_) raise(kind::kValue, "GemmProgram: built already");
    if (pending_.empty()) raise(kind::kValue, "GemmProgram: no ops");
    DeviceScope scope(static_cast<int>(device));
    program_ = std::make_unique<GemmProgram>(pending_, static_cast<int>(m));
    rows = m;
  });
}

void GemmProgramObj::run(DLView on, bool pdl) {
  translated([&] {
    if (!program_) raise(kind::kValue, "GemmProgram: run before build()");
    const int dev = static_cast<int>(device);
    require_device(on, dev, "GemmProgram: run's tensor");
    DeviceScope scope(dev);
    program_->run(current_stream(dev), pdl);
  });
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::ObjectDef<GemmProgramObj>(refl::init(false))
      .def_ro("device", &GemmProgramObj::device)
      .def_ro("ops", &GemmProgramObj::ops)
      .def_ro("rows", &GemmProgramObj::rows)
      .def("add_gemm", &GemmProgramObj::add_gemm)
      .def("add_norm", &GemmProgramObj::add_norm)
      .def("build", &GemmProgramObj::build)
      .def("run", &GemmProgramObj::run);
}

}  // namespace tpdecode::python
