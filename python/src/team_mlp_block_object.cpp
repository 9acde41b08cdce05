#include "team_mlp_block_object.hpp"

#include <tvm/ffi/reflection/registry.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "errors.hpp"

namespace tpdecode::python {

TeamMlpBlockObj::TeamMlpBlockObj(tvm::ffi::ObjectRef team, tvm::ffi::Optional<DLView> o_proj, DLView post_norm,
                                 DLView gate_up, DLView down, DLView next_norm, tvm::ffi::Optional<DLView> qkv,
                                 double eps, DLView attn, DLView residual, DLView out, const std::string& form,
                                 int64_t comm_group)
    : team_ref_(std::move(team)) {
  translated([&] {
    std::optional<TeamMlpBlock::Form> wanted;
    if (form == "program") wanted = TeamMlpBlock::Form::kProgram;
    else if (form == "launches") wanted = TeamMlpBlock::Form::kLaunches;
    else if (!form.empty()) raise(kind::kValue, "MlpBlock: form must be None, \"program\" or \"launches\"");
    const auto* t = team_ref_.as<TeamObj>();
    if (t == nullptr) raise(kind::kValue, "MlpBlock: team is not a tpdecode team");
    team_ = const_cast<TeamObj*>(t);
    device = team_->device;
    const int n = static_cast<int>(team_->driven), dev = static_cast<int>(device);
    // Each rank's [rows, cols] (rank_rows checks device, layout and alignment).
    auto bf16_rows = [&](const DLView& v, int ranks, const char* what) {
      require_bf16(v, what);
      return rank_rows(v, ranks, dev, DType::kBF16, what);
    };
    auto per_rank = [&](const DLView& v, const char* what) { return bf16_rows(v, n, what); };
    auto optional = [&](const tvm::ffi::Optional<DLView>& v, const char* what) {
      return v.has_value() ? per_rank(v.value(), what) : std::vector<TensorView>(static_cast<std::size_t>(n));
    };
    auto shared = [&](const DLView& v, const char* what) {
      const TensorView w = bf16_rows(v, 1, what)[0];
      return TensorView::bf16(w.data, 1, w.rows * w.cols);
    };
    const std::vector<TensorView> wo = optional(o_proj, "MlpBlock: o_proj"), wgu = per_rank(gate_up, "MlpBlock: gate_up"),
                                  wd = per_rank(down, "MlpBlock: down"), wq = optional(qkv, "MlpBlock: qkv"),
                                  a = per_rank(attn, "MlpBlock: attn"), r = per_rank(residual, "MlpBlock: residual"),
                                  o = per_rank(out, "MlpBlock: out");
    const TensorView g1 = shared(post_norm, "MlpBlock: post_norm"), g2 = shared(next_norm, "MlpBlock: next_norm");
    std::vector<TeamMlpBlock::Weights> weights;
    std::vector<TeamMlpBlock::Buffers> buffers;
    for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
      weights.push_back({wo[i], g1, wgu[i], wd[i], g2, wq[i], static_cast<float>(eps)});
      buffers.push_back({a[i], r[i], o[i]});
    }
    rows = buffers[0].residual.rows;
    DeviceScope scope(dev);
    if (comm_group < 0 || comm_group > INT32_MAX) raise(kind::kValue, "MlpBlock: comm_group must be 0 or more");
    block_ = std::make_unique<TeamMlpBlock>(team_->team(), weights, buffers, static_cast<int>(rows), wanted,
                                            static_cast<int>(comm_group));
    launches = block_->form() == TeamMlpBlock::Form::kLaunches;
  });
}

void TeamMlpBlockObj::run(DLView on, bool /*pdl*/) {
  translated([&] {
    require_device(on, static_cast<int>(device), "MlpBlock: run's tensor");
    team_->on_rank_streams([&](std::span<const cudaStream_t> streams) { block_->run(streams); });
  });
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::ObjectDef<TeamMlpBlockObj>(refl::init(false))
      .def_ro("device", &TeamMlpBlockObj::device)
      .def_ro("rows", &TeamMlpBlockObj::rows)
      .def_ro("launches", &TeamMlpBlockObj::launches)
      .def("run", &TeamMlpBlockObj::run);
}

}  // namespace tpdecode::python
