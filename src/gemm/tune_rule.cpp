#include "gemm/tune_rule.hpp"

#include <algorithm>
#include <cmath>

namespace tpdecode {
namespace {

bool valid(double v) { return std::isfinite(v) && v > 0; }

// Indices into `values` with a valid value, lowest first (ties: lower index).
std::vector<std::size_t> ranked(const std::vector<double>& values) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < values.size(); ++i)
    if (valid(values[i])) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return values[a] < values[b]; });
  return order;
}

// The lead of ranked[0] over ranked[1] (0 with fewer than two).
double lead_of(const std::vector<double>& medians, const std::vector<std::size_t>& order) {
  return order.size() < 2 ? 0.0 : medians[order[1]] / medians[order[0]] - 1.0;
}

}  // namespace

double valid_median(const std::vector<double>& sample) {
  std::vector<double> v;
  v.reserve(sample.size());
  for (double x : sample)
    if (valid(x)) v.push_back(x);
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double valid_min(const std::vector<double>& sample) {
  double best = std::nan("");
  for (double x : sample)
    if (valid(x) && !(best <= x)) best = x;
  return best;
}

std::vector<std::size_t> gemm_finalists(const GemmSamples& phase1, const GemmTuneRule& rule) {
  std::vector<double> medians, fastest;
  for (const std::vector<double>& s : phase1) {
    medians.push_back(valid_median(s));
    fastest.push_back(valid_min(s));
  }
  const std::vector<std::size_t> by_median = ranked(medians);
  if (by_median.empty()) return {};
  const std::size_t leader = by_median[0];
  const double limit = medians[leader] * (1.0 + rule.window);
  std::vector<std::size_t> finalists;
  for (std::size_t i : ranked(fastest))
    if (fastest[i] <= limit) finalists.push_back(i);
  // The median leader (phase 1's choice) keeps the last place where more qualify.
  const auto cap = static_cast<std::ptrdiff_t>(std::max(1, rule.max_finalists));
  if (std::ssize(finalists) > cap) {
    if (std::find(finalists.begin(), finalists.begin() + cap, leader) == finalists.begin() + cap)
      finalists[static_cast<std::size_t>(cap - 1)] = leader;
    finalists.resize(static_cast<std::size_t>(cap));
  }
  return finalists;
}

std::size_t round_winner(const std::vector<std::size_t>& finalists, const GemmSamples& round) {
  std::size_t best = kNoCandidate;
  double best_us = 0;
  for (std::size_t f = 0; f < finalists.size() && f < round.size(); ++f) {
    const double us = valid_median(round[f]);
    if (!valid(us)) continue;
    if (best == kNoCandidate || us < best_us || (us == best_us && finalists[f] < best)) {
      best = finalists[f];
      best_us = us;
    }
  }
  return best;
}

GemmRoundVerdict judge_rounds(const std::vector<std::size_t>& finalists, const std::vector<GemmSamples>& rounds,
                              const GemmTuneRule& rule) {
  // Pooled: every phase-2 sample of each finalist.
  std::vector<double> pooled(finalists.size());
  for (std::size_t f = 0; f < finalists.size(); ++f) {
    std::vector<double> all;
    for (const GemmSamples& r : rounds)
      if (f < r.size()) all.insert(all.end(), r[f].begin(), r[f].end());
    pooled[f] = valid_median(all);
  }
  // Ranked by pooled median, ties by candidate index (finalists are not in index order).
  std::vector<std::size_t> order;
  for (std::size_t f = 0; f < finalists.size(); ++f)
    if (valid(pooled[f])) order.push_back(f);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return pooled[a] != pooled[b] ? pooled[a] < pooled[b] : finalists[a] < finalists[b];
  });
  GemmRoundVerdict v;
  if (order.empty()) return v;
  v.winner = finalists[order[0]];
  v.us = pooled[order[0]];
  v.lead = lead_of(pooled, order);
  const int need = std::max(1, rule.stable_rounds);
  if (static_cast<int>(rounds.size()) >= need) {
    v.stable = true;
    for (std::size_t r = rounds.size() - static_cast<std::size_t>(need); r < rounds.size(); ++r)
      v.stable = v.stable && round_winner(finalists, rounds[r]) == v.winner;
  }
  return v;
}

GemmChoice choose_fastest(const GemmSamples& phase1) {
  std::vector<double> medians;
  for (const std::vector<double>& s : phase1) medians.push_back(valid_median(s));
  const std::vector<std::size_t> order = ranked(medians);
  GemmChoice c;
  if (order.empty()) return c;
  c.winner = order[0];
  c.us = medians[order[0]];
  c.lead = lead_of(medians, order);
  c.finalists = 1;
  c.stable = true;
  return c;
}

GemmChoice choose_gemm(const GemmSamples& phase1, const GemmRetime& retime, const GemmTuneRule& rule,
                       const std::function<bool()>& more) {
  GemmChoice c = choose_fastest(phase1);
  const std::vector<std::size_t> finalists = gemm_finalists(phase1, rule);
  c.finalists = static_cast<int>(finalists.size());
  if (finalists.size() < 2 || !retime) return c;
  c.stable = false;
  std::vector<GemmSamples> rounds;
  GemmRoundVerdict v;
  while (static_cast<int>(rounds.size()) < rule.max_rounds) {
    if (static_cast<int>(rounds.size()) >= rule.stable_rounds && more && !more()) break;
    rounds.push_back(retime(finalists));
    v = judge_rounds(finalists, rounds, rule);
    if (v.stable) break;
  }
  c.rounds = static_cast<int>(rounds.size());
  if (v.winner == kNoCandidate) return c;  // phase 2 measured nothing: phase 1's fastest
  c.winner = v.winner;
  c.us = v.us;
  c.lead = v.lead;
  c.stable = v.stable;
  return c;
}

}  // namespace tpdecode
