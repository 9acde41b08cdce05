#include "tpdecode/team_mlp_block.hpp"

#include <utility>
#include <vector>

#include "core/check.hpp"
#include "core/tensor_overlap.hpp"
#include "program/mlp_block_ops.hpp"
#include "program/mlp_block_scratch.hpp"
#include "program/team_mlp_block_launches.hpp"
#include "team/team_internals.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {

struct TeamMlpBlock::Impl {
  std::vector<program::MlpBlockScratchMemory> scratch;  // per driven rank
  std::unique_ptr<TeamProgram> program;                 // Form::kProgram
  std::unique_ptr<program::TeamMlpBlockLaunches> launches;  // Form::kLaunches
};

TeamMlpBlock::TeamMlpBlock(Team& team, std::span<const Weights> weights, std::span<const Buffers> buffers, int m,
                           std::optional<Form> form, int comm_group)
    : impl_(std::make_unique<Impl>()) {
  check(comm_group >= 0, "team mlp block: comm group {} (0 or more)", comm_group);
  // Why: a group other than 0 is for blocks that may run at once; the program form
  // holds a rank's SMs and waits on its peers, so two at once may wait on each other.
  check(comm_group == 0 || form != Form::kProgram,
        "team mlp block: comm group {} is for blocks that may run at once, which the program form cannot: ask for "
        "launches (or group 0)",
        comm_group);
  const auto driven = static_cast<std::size_t>(team.driven());
  check(weights.size() == driven && buffers.size() == driven,
        "team mlp block: {} weight sets and {} buffer sets for the {} ranks this object drives", weights.size(),
        buffers.size(), driven);
  Impl& p = *impl_;
  std::vector<std::vector<GemmProgram::Op>> ops;
  program::MlpBlockWidths first{};
  for (std::size_t i = 0; i < driven; ++i) {
    const Weights& w = weights[i];
    const Buffers& b = buffers[i];
    program::MlpBlockWidths widths{};
    try {
      widths = program::check_mlp_block(w, b, m);
      check(w.next_norm.data != nullptr,
            "mlp block: next_norm is missing (at TP > 1 the down projection's partial is all-reduced into it)");
      if (i == 0) first = widths;
      check(widths.hidden == first.hidden && widths.intermediate == first.intermediate,
            "mlp block: H {} and I / tp {} where driven rank 0 has {} and {}", widths.hidden, widths.intermediate,
            first.hidden, first.intermediate);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("team {} (driven rank {}, rank {})", e.what(), i, team.rank(static_cast<int>(i))));
    }
    p.scratch.push_back(program::mlp_block_scratch(widths, m));
    ops.push_back(program::mlp_block_ops(w, b, p.scratch.back().views, program::MlpBlockNorms::kAllReduce).ops);
  }
  // The driven ranks run at once: one's writes may not meet another's tensors (a
  // residual shared by two ranks of a local team, say).
  for (std::size_t i = 0; i < driven; ++i)
    for (std::size_t j = 0; j < driven; ++j) {
      if (i == j) continue;
      const std::pair<const TensorView*, const char*> written[] = {{&buffers[i].out, "out"},
                                                                    {&buffers[i].residual, "residual"}};
      const std::pair<const TensorView*, const char*> theirs[] = {
          {&buffers[j].attn, "attn"}, {&buffers[j].residual, "residual"}, {&buffers[j].out, "out"}};
      for (const auto& [mine, name] : written)
        for (const auto& [other, other_name] : theirs)
          check(!views_overlap(*mine, *other), "team mlp block: driven rank {}'s {} overlaps driven rank {}'s {}", i,
                name, j, other_name);
    }
  if (comm_group == 0 && form.value_or(default_form(m, rank_context(team, 0).ranks_on_device)) == Form::kProgram) {
    try {
      p.program = std::make_unique<TeamProgram>(team, std::move(ops), m);
      return;
    } catch (const Unavailable&) {
      if (form) throw;  // asked for as a program
    }
  }
  std::vector<program::MlpBlockScratch> views;
  for (const program::MlpBlockScratchMemory& s : p.scratch) views.push_back(s.views);
  p.launches = std::make_unique<program::TeamMlpBlockLaunches>(team, weights, buffers, views, m, comm_group);
}

TeamMlpBlock::~TeamMlpBlock() = default;

void TeamMlpBlock::run(std::span<const cudaStream_t> streams) const {
  if (impl_->launches)
    impl_->launches->run(streams);
  else
    impl_->program->run(streams);
}

TeamMlpBlock::Form TeamMlpBlock::default_form(int m, int ranks_on_device) {
  return m <= MlpBlockProgram::kProgramMaxRows && ranks_on_device == 1 ? Form::kProgram : Form::kLaunches;
}

TeamMlpBlock::Form TeamMlpBlock::form() const { return impl_->launches ? Form::kLaunches : Form::kProgram; }

const TeamProgram& TeamMlpBlock::program() const {
  check(impl_->program != nullptr, "team mlp block: it runs as launches (form() is kLaunches), not as a program");
  return *impl_->program;
}

}  // namespace tpdecode
