// TeamProgram's host side: the team mailbox, one GemmProgram per driven rank on
// its share of the SMs, the launches.
#include "tpdecode/team_program.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "comm/mailbox.hpp"
#include "core/check.hpp"
#include "core/hash.hpp"
#include "program/program_launch.hpp"
#include "program/team_binding.hpp"
#include "team/rank_streams.hpp"
#include "team/team_internals.hpp"

namespace tpdecode {

namespace {

// The team program's all-reduce widths as its mailbox's owner, compared across the
// ranks (team/symmetric_layout.hpp): listed, or counted and hashed where the list
// would not fit.
std::string all_reduces_named(const std::vector<int64_t>& widths) {
  std::string list;
  uint64_t h = 0;
  for (const int64_t w : widths) {
    list += fmt::format("{}{}", list.empty() ? "" : ",", w);
    h = hash::mix64(h ^ static_cast<uint64_t>(w));
  }
  if (list.size() <= 48) return fmt::format("team program, all-reduces of {}:", list);
  return fmt::format("team program, {} all-reduces #{:016x}:", widths.size(), h);
}

}  // namespace

struct TeamProgram::Impl {
  Team* team = nullptr;
  std::unique_ptr<Mailbox> box;  // where an op all-reduces
  std::vector<std::unique_ptr<GemmProgram>> programs;  // per driven rank
  std::vector<bool> pdl;                                // per driven rank
};

TeamProgram::TeamProgram(Team& team, std::vector<std::vector<GemmProgram::Op>> ops, int m, bool record_timeline)
    : impl_(std::make_unique<Impl>()) {
  Impl& p = *impl_;
  p.team = &team;
  check(static_cast<int>(ops.size()) == team.driven(), "team program: {} op lists for the {} ranks this object drives",
        ops.size(), team.driven());
  check(m >= 1 && m <= GemmProgram::kMaxRows, "team program: {} rows where 1 to {} are served", m,
        GemmProgram::kMaxRows);
  check<Unavailable>(team.shares_memory(), "team program: the team's ranks do not share memory ({})",
                     team.describe());
  int device = 0;
  TPD_CUDA(cudaGetDevice(&device));
  check(device == team.device(0), "team program: built on device {}, the team's is {}", device, team.device(0));
  // The all-reduce windows: the same on every driven rank (and, by the contract, on
  // every rank of the team).
  auto widths = [](const std::vector<GemmProgram::Op>& list) {
    std::vector<int64_t> w;
    for (const GemmProgram::Op& op : list)
      if (op.is_norm && op.norm.all_reduce) w.push_back(op.norm.x.cols);
    return w;
  };
  for (std::size_t i = 1; i < ops.size(); ++i)
    check(widths(ops[i]) == widths(ops[0]), "team program: driven rank {}'s all-reduce ops differ from driven rank 0's",
          i);
  int64_t fragments = 0;  // of the mailbox's row, laid out as the kernels read it
  program::team_windows(ops[0], &fragments);
  // No mailbox (nor epoch counter) where no op all-reduces: by the contract, on no rank.
  if (fragments > 0)
    p.box = std::make_unique<Mailbox>(team, all_reduces_named(widths(ops[0])), 2, team.size(), m, fragments * 16);
  int sms = 0;
  TPD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  for (int i = 0; i < team.driven(); ++i) {
    const RankContext& ctx = rank_context(team, i);
    program::TeamBinding binding;
    binding.team = ctx.team;
    if (p.box) binding.box = p.box->ref(i);
    // Why the SMs divided: every rank's program waits for its peers', so all must
    // be resident at once (the kernel holds one CTA per SM).
    binding.ctas = sms / std::max(1, ctx.ranks_on_device);
    check<Unavailable>(binding.ctas >= 1, "team program: {} ranks share a GPU of {} SMs", ctx.ranks_on_device, sms);
    p.programs.push_back(std::unique_ptr<GemmProgram>(
        new GemmProgram(std::move(ops[static_cast<std::size_t>(i)]), m, record_timeline, &binding)));
    p.pdl.push_back(ctx.pdl_on_own_gpu());
  }
}

TeamProgram::~TeamProgram() = default;

void TeamProgram::run(std::span<const cudaStream_t> streams) const {
  const Impl& p = *impl_;
  check(streams.empty() || static_cast<int>(streams.size()) == p.team->driven(),
        "team program: {} streams for the {} ranks this object drives", streams.size(), p.team->driven());
  check_distinct_streams(streams, "team program");
  check<TeamBroken>(!p.team->broken(), "team program: {} is broken; build a new team", p.team->describe());
  for (int i = 0; i < p.team->driven(); ++i)
    p.programs[static_cast<std::size_t>(i)]->run(
        streams.empty() ? p.team->stream(i) : streams[static_cast<std::size_t>(i)], p.pdl[static_cast<std::size_t>(i)]);
}

const GemmProgram& TeamProgram::program(int driven) const {
  check(driven >= 0 && driven < static_cast<int>(impl_->programs.size()), "team program: driven rank {} of {}",
        driven, impl_->programs.size());
  return *impl_->programs[static_cast<std::size_t>(driven)];
}

int TeamProgram::ctas() const { return impl_->programs.front()->ctas(); }

}  // namespace tpdecode
