#include "drafter_run.hpp"

#include <fmt/format.h>

#include <cmath>

#include "core/bf16.hpp"
#include "core/graph_timing.hpp"
#include "drafter/gpu_drafter.hpp"
#include "drafter/token_agreement.hpp"

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

// Logits that are NaN or infinite (a step's bug: the drafter's logits are finite).
int non_finite(const std::vector<uint16_t>& logits) {
  int n = 0;
  for (uint16_t v : logits) n += !std::isfinite(bf16::to_float(v));
  return n;
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
    r.non_finite_logits = non_finite(stock) + non_finite(spec);
    for (std::size_t i = 0; i < stock.size(); ++i) {
      const double diff = std::abs(bf16::to_float(stock[i]) - bf16::to_float(spec[i]));
      // Why not std::max: it keeps the old value against a NaN, which would hide it.
      if (std::isnan(diff) || diff > r.max_logit_diff) r.max_logit_diff = diff;
      if (std::isnan(r.max_logit_diff)) break;
    }
    const drafter::TokenAgreement spec_agreement = drafter::compare_tokens(stock, stock_tokens, spec_tokens, config.vocab);
    r.token_disagreements = spec_agreement.disagreements;
    r.disagreements_near_tie = spec_agreement.near_ties;
    say(fmt::format("M = {}: timing graphs of both paths", m));
    r.stock = time_path(d, DrafterPath::kStock, m, o.replays);
    r.specialised = time_path(d, DrafterPath::kSpecialised, m, o.replays);
    r.repeat_bitwise = d.logits(0, m) == spec;
    if (d.serves_programs()) {
      r.program.form = drafter::form_name(drafter::GpuDrafter::program_form(m));
      say(fmt::format("M = {}: the program path ({}), eager and timed", m, r.program.form));
      const std::vector<uint16_t> prog = eager_logits(d, DrafterPath::kProgram, m);
      r.non_finite_logits += non_finite(prog);
      const drafter::TokenAgreement agreement = drafter::compare_tokens(stock, stock_tokens, d.tokens(0, m), config.vocab);
      r.program.token_disagreements = agreement.disagreements;
      r.program.disagreements_near_tie = agreement.near_ties;
      r.program.step_us = time_step(d, DrafterPath::kProgram, m, {}, o.replays);
      r.program.repeat_bitwise = d.logits(0, m) == prog;
    }
    rows.push_back(r);
  }
}

}  // namespace tpdecode::cli
