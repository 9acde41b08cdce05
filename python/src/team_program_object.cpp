#include "team_program_object.hpp"

#include <tvm/ffi/reflection/registry.h>

#include <string>

#include "errors.hpp"
#include "program_ops.hpp"

namespace tpdecode::python {

TeamProgramObj::TeamProgramObj(tvm::ffi::ObjectRef team) : team_ref_(std::move(team)) {
  translated([&] {
    const auto* t = team_ref_.as<TeamObj>();
    if (t == nullptr) raise(kind::kValue, "TeamProgram: team is not a tpdecode team");
    team_ = const_cast<TeamObj*>(t);
    device = team_->device;
    driven = team_->driven;
    pending_.resize(static_cast<std::size_t>(driven));
  });
}

std::vector<GemmProgram::Op>& TeamProgramObj::ops_of(int64_t rank) {
  if (program_) raise(kind::kValue, "TeamProgram: ops are added before build()");
  if (rank < 0 || rank >= driven)
    raise(kind::kValue, "TeamProgram: rank " + std::to_string(rank) + " of a team object driving " +
                            std::to_string(driven) + " rank(s)");
  return pending_[static_cast<std::size_t>(rank)];
}

void TeamProgramObj::add_gemm(int64_t rank, DLView weight, DLView x, DLView out, int64_t after, bool silu_mul) {
  translated([&] {
    ops_of(rank).push_back(program_gemm("TeamProgram", static_cast<int>(device), weight, x, out, after, silu_mul));
  });
}

void TeamProgramObj::add_norm(int64_t rank, DLView x, int64_t after, DLView weight, double eps,
                              tvm::ffi::Optional<DLView> residual, tvm::ffi::Optional<DLView> residual_out,
                              DLView out, bool folded, bool all_reduce) {
  translated([&] {
    ops_of(rank).push_back(program_norm("TeamProgram", static_cast<int>(device), x, after, weight, eps, residual,
                                        residual_out, out, folded, all_reduce));
  });
}

void TeamProgramObj::build(int64_t m) {
  translated([&] {
    if (program_) raise(kind::kValue, "TeamProgram: built already");
    for (std::size_t r = 0; r < pending_.size(); ++r)
      if (pending_[r].empty()) raise(kind::kValue, "TeamProgram: no ops for rank " + std::to_string(r));
    DeviceScope scope(static_cast<int>(device));
    program_ = std::make_unique<TeamProgram>(team_->team(), pending_, static_cast<int>(m));
    rows = m;
    ctas = program_->ctas();
  });
}

void TeamProgramObj::run(DLView on, bool /*pdl*/) {
  translated([&] {
    if (!program_) raise(kind::kValue, "TeamProgram: run before build()");
    require_device(on, static_cast<int>(device), "TeamProgram: run's tensor");
    team_->on_rank_streams([&](std::span<const cudaStream_t> streams) { program_->run(streams); });
  });
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::ObjectDef<TeamProgramObj>(refl::init(false))
      .def_ro("device", &TeamProgramObj::device)
      .def_ro("driven", &TeamProgramObj::driven)
      .def_ro("rows", &TeamProgramObj::rows)
      .def_ro("ctas", &TeamProgramObj::ctas)
      .def("add_gemm", &TeamProgramObj::add_gemm)
      .def("add_norm", &TeamProgramObj::add_norm)
      .def("build", &TeamProgramObj::build)
      .def("run", &TeamProgramObj::run);
}

}  // namespace tpdecode::python
