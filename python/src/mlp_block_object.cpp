#include "mlp_block_object.hpp"

#include <tvm/ffi/reflection/registry.h>

#include "errors.hpp"

namespace tpdecode::python {

MlpBlockObj::MlpBlockObj(tvm::ffi::Optional<DLView> o_proj, DLView post_norm, DLView gate_up, DLView down,
                         tvm::ffi::Optional<DLView> next_norm, tvm::ffi::Optional<DLView> qkv, double eps,
                         DLView attn, DLView residual, DLView out, bool fold, const std::string& form) {
  translated([&] {
    std::optional<MlpBlockProgram::Form> wanted;
    if (form == "program") wanted = MlpBlockProgram::Form::kProgram;
    else if (form == "launches") wanted = MlpBlockProgram::Form::kLaunches;
    else if (!form.empty()) raise(kind::kValue, "MlpBlock: form must be None, \"program\" or \"launches\"");
    const DLDevice d = residual.device();
    if (d.device_type != kDLCUDA) raise(kind::kValue, "MlpBlock: residual must be a CUDA tensor");
    device = d.device_id;
    const int dev = static_cast<int>(device);
    auto matrix = [dev](const DLView& t, const char* what) { return bf16_matrix(t, dev, what); };
    auto optional = [&](const tvm::ffi::Optional<DLView>& t, const char* what) {
      return t.has_value() ? matrix(t.value(), what) : TensorView{};
    };
    MlpBlockProgram::Weights w{optional(o_proj, "MlpBlock: o_proj"), matrix(post_norm, "MlpBlock: post_norm"),
                               matrix(gate_up, "MlpBlock: gate_up"), matrix(down, "MlpBlock: down"),
                               optional(next_norm, "MlpBlock: next_norm"), optional(qkv, "MlpBlock: qkv"),
                               static_cast<float>(eps)};
    const MlpBlockProgram::Buffers b{matrix(attn, "MlpBlock: attn"), matrix(residual, "MlpBlock: residual"),
                                     matrix(out, "MlpBlock: out")};
    rows = b.residual.rows;
    DeviceScope scope(dev);
    block_ = std::make_unique<MlpBlockProgram>(w, b, static_cast<int>(rows), fold, wanted);
    post_norm_folded = block_->post_norm_folded();
    next_norm_folded = block_->next_norm_folded();
    launches = block_->form() == MlpBlockProgram::Form::kLaunches;
  });
}

void MlpBlockObj::run(DLView on, bool pdl) {
  translated([&] {
    const int dev = static_cast<int>(device);
    require_device(on, dev, "MlpBlock: run's tensor");
    DeviceScope scope(dev);
    block_->run(current_stream(dev), pdl);
  });
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::ObjectDef<MlpBlockObj>(refl::init(false))
      .def_ro("device", &MlpBlockObj::device)
      .def_ro("rows", &MlpBlockObj::rows)
      .def_ro("post_norm_folded", &MlpBlockObj::post_norm_folded)
      .def_ro("next_norm_folded", &MlpBlockObj::next_norm_folded)
      .def_ro("launches", &MlpBlockObj::launches)
      .def("run", &MlpBlockObj::run);
}

}  // namespace tpdecode::python
