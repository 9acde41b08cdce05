#include "drafter_run.hpp"

#include <fmt/format.h>

#include <cmath>

#include "core/bf16.hpp"
#include "core/graph_timing.hpp"
#include "drafter/gpu_drafter.hpp"

namespace tpdecode::cli {

namespace {

using drafter::DrafterPath;
using drafter::GpuDrafter;
using drafter::OpFilter;
using drafter::OpKind;

uint64_t fnv1a(const std::vector<uint16_t>& v) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint16_t x : v) h = (h ^ x) * 0x100000001b3ull;
  return h;
}

// One BF16 ulp at |v| (normal numbers).
float bf16_ulp(float v) {
  const float a = std::max(std::abs(v), 1e-30f);
  return std::ldexp(1.0f, static_cast<int>(std::floor(std::log2(a))) - 7);
}

double time_step(GpuDrafter& d, DrafterPath path, int m, const OpFilter& filter, int replays) {
  const GraphTiming t =
      time_graph(d.stream(), [&](cudaStream_t, int) { d.enqueue_step(path, m, filter); }, 1, replays);
  return t.median_us;
}

PathTimes time_path(GpuDrafter& d, DrafterPath path, int m, int replays) {
  PathTimes t;
  t.gemm_us = time_step(d, path, m, OpFilter::only(OpKind::kGemm), replays);
  t.collective_us = time_step(d, path, m, OpFilter::only(OpKind::kCollective), replays);
  t.other_us = time_step(d, path, m, OpFilter::only(OpKind::kOther), replays);
  t.step_us = time_step(d, path, m, {}, replays);  // last: leaves this path's logits in place
  return t;
}

// One eager step, then driven rank 0's logits.
std::vector<uint16_t> eager_logits(GpuDrafter& d, DrafterPath path, int m) {
  d.enqueue_step(path, m);
  return d.logits(0, m);
}

}  // namespace

void measure_drafter(Team& team, const drafter::DrafterConfig& config, const DrafterRunOptions& o,
                     std::vector<DrafterRow>& rows, std::string* comm_note) {
  const auto say = [&](const std::string& s) {
    if (o.verbose) fmt::print(stderr, "drafter: {}\n", s);
  };
  say(fmt::format("building weights for TP {} ({}) ...", team.size(), team.describe()));
  GpuDrafter d(team, config, 64, say);
  d.set_oproj_kind(o.oproj);
  for (int m : o.rows) {
    say(fmt::format("M = {}: eager steps of both paths, compared", m));
    d.prepare(m);
    DrafterRow r;
    r.m = m;
    const std::vector<uint16_t> stock = eager_logits(d, DrafterPath::kStock, m);
    const std::vector<int32_t> stock_tokens = d.tokens(0, m);
    const std::vector<uint16_t> spec = eager_logits(d, DrafterPath::kSpecialised, m);
    const std::vector<int32_t> spec_tokens = d.tokens(0, m);
    if (comm_note) *comm_note += fmt::format("{}M {}: {}", comm_note->empty() ? "" : "; ", m, d.comm_paths());
    r.ranks_identical = true;
    for (int i = 1; i < team.driven(); ++i) r.ranks_identical &= d.logits(i, m) == spec;
    r.logits_hash = fnv1a(spec);
    const auto vocab = static_cast<std::size_t>(config.vocab);
    for (std::size_t i = 0; i < stock.size(); ++i)
      r.max_logit_diff =
          std::max(r.max_logit_diff, static_cast<double>(std::abs(bf16::to_float(stock[i]) - bf16::to_float(spec[i]))));
    // Rows whose tokens differ from the stock path's, and of those the near ties.
    const auto disagreements = [&](const std::vector<int32_t>& tokens, int& all, int& near_tie) {
      for (std::size_t row = 0; row < static_cast<std::size_t>(m); ++row) {
        if (stock_tokens[row] == tokens[row]) continue;
        ++all;
        const float top = bf16::to_float(stock[row * vocab + static_cast<std::size_t>(stock_tokens[row])]);
        const float other = bf16::to_float(stock[row * vocab + static_cast<std::size_t>(tokens[row])]);
        if (top - other <= kNearTieUlps * bf16_ulp(top)) ++near_tie;
      }
    };
    disagreements(spec_tokens, r.token_disagreements, r.disagreements_near_tie);
    say(fmt::format("M = {}: timing graphs of both paths", m));
    r.stock = time_path(d, DrafterPath::kStock, m, o.replays);
    r.specialised = time_path(d, DrafterPath::kSpecialised, m, o.replays);
    r.repeat_bitwise = d.logits(0, m) == spec;
    if (d.serves_programs()) {
      say(fmt::format("M = {}: the program path, eager and timed", m));
      const std::vector<uint16_t> prog = eager_logits(d, DrafterPath::kProgram, m);
      disagreements(d.tokens(0, m), r.program.token_disagreements, r.program.disagreements_near_tie);
      r.program.step_us = time_step(d, DrafterPath::kProgram, m, {}, o.replays);
      r.program.repeat_bitwise = d.logits(0, m) == prog;
    }
    rows.push_back(r);
  }
}

}  // namespace tpdecode::cli
