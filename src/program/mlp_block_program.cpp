#include "tpdecode/mlp_block_program.hpp"

#include <optional>

#include "core/check.hpp"
#include "program/mlp_block_launches.hpp"
#include "program/mlp_block_ops.hpp"
#include "program/mlp_block_scratch.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {

struct MlpBlockProgram::Impl {
  program::MlpBlockScratchMemory scratch;
  bool post_folded = false, next_folded = false;
  std::optional<GemmProgram> program;              // Form::kProgram
  std::unique_ptr<program::MlpBlockLaunches> launches;  // Form::kLaunches
};

MlpBlockProgram::MlpBlockProgram(const Weights& weights, const Buffers& buffers, int m, bool fold,
                                 std::optional<Form> form)
    : impl_(std::make_unique<Impl>()) {
  Impl& p = *impl_;
  p.scratch = program::mlp_block_scratch(program::check_mlp_block(weights, buffers, m), m);
  const program::MlpBlockScratch& scratch = p.scratch.views;
  const bool launches = form ? *form == Form::kLaunches
                             : m > kProgramMaxRows && program::launches_serve(weights, buffers);
  if (launches) {
    p.launches = std::make_unique<program::MlpBlockLaunches>(weights, buffers, scratch, m);
    return;
  }
  auto build = [&](bool folds) {
    program::MlpBlockOps ops = program::mlp_block_ops(weights, buffers, scratch,
                                                      folds ? program::MlpBlockNorms::kFold : program::MlpBlockNorms::kNormOps);
    auto folded = [&](int op) { return op >= 0 && ops.ops[static_cast<std::size_t>(op)].norm.folded; };
    p.post_folded = folded(ops.post_norm);
    p.next_folded = folded(ops.next_norm);
    p.program.emplace(std::move(ops.ops), m);
  };
  try {
    build(fold);
  } catch (const Unavailable&) {
    // A fold above what the program serves (GemmProgram refuses it as Unavailable):
    // the norms as norm ops (Unavailable again where the program itself is not served).
    if (!fold) throw;
    build(false);
  }
}

MlpBlockProgram::~MlpBlockProgram() = default;

void MlpBlockProgram::run(cudaStream_t stream, bool pdl) const {
  if (impl_->launches)
    impl_->launches->run(stream, pdl);
  else
    impl_->program->run(stream, pdl);
}
MlpBlockProgram::Form MlpBlockProgram::form() const { return impl_->launches ? Form::kLaunches : Form::kProgram; }
bool MlpBlockProgram::post_norm_folded() const { return impl_->post_folded; }
bool MlpBlockProgram::next_norm_folded() const { return impl_->next_folded; }
const GemmProgram& MlpBlockProgram::program() const {
  check(impl_->program.has_value(), "mlp block: it runs as launches (form() is kLaunches), not as a program");
  return *impl_->program;
}

}  // namespace tpdecode
