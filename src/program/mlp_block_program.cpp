#include "tpdecode/mlp_block_program.hpp"

#include <optional>

#include "core/check.hpp"
#include "program/mlp_block_launches.hpp"
#include "program/mlp_block_ops.hpp"
#include "tpdecode/device_buffer.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {

struct MlpBlockProgram::Impl {
  DeviceBuffer scratch;  // o, h, act, y, h2 back to back
  bool post_folded = false, next_folded = false;
  std::optional<GemmProgram> program;              // Form::kProgram
  std::unique_ptr<program::MlpBlockLaunches> launches;  // Form::kLaunches
};

MlpBlockProgram::MlpBlockProgram(const Weights& weights, const Buffers& buffers, int m, bool fold,
                                 std::optional<Form> form)
    : impl_(std::make_unique<Impl>()) {
  const program::MlpBlockWidths widths = program::check_mlp_block(weights, buffers, m);
  const int64_t h = widths.hidden, inter = widths.intermediate;
  // o, h, act, y, h2 back to back, each from a 16-byte boundary.
  const int64_t cols[] = {h, h, inter, h, h};
  auto padded = [m](int64_t c) { return (m * c + 7) / 8 * 8; };
  int64_t total = 0;
  for (int64_t c : cols) total += padded(c);
  Impl& p = *impl_;
  p.scratch = DeviceBuffer(static_cast<std::size_t>(total) * 2);
  TensorView views[5];
  int64_t at = 0;
  for (int i = 0; i < 5; ++i) {
    views[i] = TensorView::bf16(static_cast<uint16_t*>(p.scratch.get()) + at, m, cols[i]);
    at += padded(cols[i]);
  }
  const program::MlpBlockScratch scratch{views[0], views[1], views[2], views[3], views[4]};
  const bool launches = form ? *form == Form::kLaunches
                             : m > kProgramMaxRows && program::launches_serve(weights, buffers);
  if (launches) {
    p.launches = std::make_unique<program::MlpBlockLaunches>(weights, buffers, scratch, m);
    return;
  }
  auto build = [&](bool folds) {
    program::MlpBlockOps ops = program::mlp_block_ops(weights, buffers, scratch, folds);
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
