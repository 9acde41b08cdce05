#include "tpdecode/gemm_tuner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>

#include "core/check.hpp"
#include "gemm/gemm_tactic.hpp"
#include "gemm/tune_file.hpp"
#include "gemm/tune_rule.hpp"
#include "gemm/wgmma_plan.hpp"
#include "tpdecode/version.hpp"
#include "tpdecode/cublas_context.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

// Bump when the candidates change (an engine or a tactic added or removed, a
// tactic's meaning changed), an engine's speed does, or the way a decision is made
// from timings does (tune_rule.hpp): decisions measured under another revision are
// not used, so every bucket is decided again among today's candidates.
constexpr int kEngineRevision = 14;  // 14: the one-tile CTA's tensor-map form (13: full-SM wgmma rings charged in chains)

// Adds a fixed cost per candidate to every sample of an inner timing.
class ChargedTiming final : public GemmTiming {
 public:
  ChargedTiming(std::unique_ptr<GemmTiming> inner, std::vector<double> charge)
      : inner_(std::move(inner)), charge_(std::move(charge)) {}
  std::vector<std::vector<double>> time(const std::vector<std::size_t>& which, int replays) override {
    std::vector<std::vector<double>> samples = inner_->time(which, replays);
    check(samples.size() == which.size(), "chain charge: {} samples for {} candidates", samples.size(), which.size());
    for (std::size_t w = 0; w < which.size(); ++w)
      for (double& us : samples[w]) us += charge_.at(which[w]);
    return samples;
  }
  int replays() const override { return inner_->replays(); }

 private:
  std::unique_ptr<GemmTiming> inner_;
  std::vector<double> charge_;
};

// A timed decision explained: the candidates by phase-1 median (fastest first) with
// their fastest phase-1 sample, each finalist's median over its phase-2 samples, the
// choice.
std::string explain(const GemmKey& key, const std::vector<GemmDecision>& candidates, const GemmSamples& phase1,
                    const std::map<std::size_t, std::vector<double>>& phase2, const GemmChoice& choice) {
  std::vector<double> median(candidates.size());  // infinite where a candidate failed
  for (std::size_t i = 0; i < median.size(); ++i) {
    const double m = valid_median(phase1[i]);
    median[i] = std::isnan(m) ? std::numeric_limits<double>::infinity() : m;
  }
  std::vector<std::size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return median[a] < median[b]; });
  std::string text =
      fmt::format("{}: {} candidates, {} finalists, {} rounds{}; phase 1 medians (fastest sample), us:",
                  key.describe(), candidates.size(), choice.finalists, choice.rounds, choice.stable ? ", stable" : "");
  for (std::size_t i : order) {
    text += fmt::format("\n  {:>9.2f} ({:>9.2f})  {}", median[i], valid_min(phase1[i]), describe(candidates[i]));
    if (const auto it = phase2.find(i); it != phase2.end())
      text += fmt::format("  (phase 2: {:.2f} over {} samples)", valid_median(it->second), it->second.size());
    if (i == choice.winner) text += "  <- chosen";
  }
  return text;
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// The map key: every field of GemmKey.
std::string id_of(const GemmKey& k) {
  return fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}{}", k.device, k.sms, k.version, k.n, k.k, k.bucket,
                     dtype_name(k.dtype), k.chain ? "chain" : "alone", k.sharing, k.invariant ? "|invariant" : "");
}

}  // namespace

std::string GemmKey::describe() const {
  return fmt::format("{} ({} SMs) {}x{} M {}-{} {}{}{}{}", device, sms, n, k, gemm_bucket_min(bucket),
                     gemm_bucket_max(bucket), dtype_name(dtype), chain ? " chain" : "",
                     sharing > 1 ? fmt::format(", shared by {}", sharing) : "", invariant ? ", batch-invariant" : "");
}

bool charged_in_chains(const GemmDecision& d, int m) {
  if (d.path == GemmPath::kWgmma)
    return wgmma::layout(d.sub_tiles, wgmma::token_tile(std::clamp(m, 1, kGemmMaxRows)), d.stages).smem_bytes >
           kWgmmaHalfBudget;
  return d.path == GemmPath::kCublas || d.path == GemmPath::kCublasLt || d.path == GemmPath::kWgmmaWide;
}

std::vector<double> charge_chain_boundaries(const std::vector<GemmDecision>& candidates, int m, std::vector<double> us) {
  check(us.size() == candidates.size(), "chain charge: {} times for {} candidates", us.size(), candidates.size());
  for (std::size_t i = 0; i < us.size(); ++i)
    if (charged_in_chains(candidates[i], m)) us[i] += kChainBoundaryUs;
  return us;
}

std::unique_ptr<GemmTiming> charge_chain_boundaries(const std::vector<GemmDecision>& candidates, int m,
                                                    std::unique_ptr<GemmTiming> timing) {
  check(timing != nullptr, "chain charge: no timing");
  return std::make_unique<ChargedTiming>(
      std::move(timing), charge_chain_boundaries(candidates, m, std::vector<double>(candidates.size())));
}

std::string gemm_library_version() {
  return fmt::format("tpdecode {} gemm r{}; cuBLASLt {}", version(), kEngineRevision,
                     CublasContext::lt_version());
}

GemmTunerOptions GemmTunerOptions::from_env() {
  GemmTunerOptions o;
  const char* tune = std::getenv("TPDECODE_TUNE");
  o.enabled = !(tune && std::string(tune) == "0");
  if (const char* path = std::getenv("TPDECODE_TUNE_CACHE")) o.cache_path = path;
  if (const char* trace = std::getenv("TPDECODE_TUNE_TRACE"); trace && std::string(trace) == "1")
    o.trace = [](const std::string& message) { fmt::print(stderr, "tpdecode: tune: {}\n", message); };
  return o;
}

struct GemmTuner::Impl {
  struct Entry {
    bool ready = false;    // false: being measured by another caller
    bool persist = false;  // written to the cache file (tuned, loaded or inserted)
    GemmKey key;
    GemmDecision decision;
  };
  GemmTunerOptions options;
  mutable std::mutex mutex;
  std::condition_variable decided;
  std::map<std::string, Entry> entries;
  std::map<int, std::mutex> device_locks;  // one measurement at a time per device
  bool file_usable = true;  // false once the file was found corrupt: never overwritten
  bool write_failed = false;

  void warn(const std::string& message) const {
    if (options.warn)
      options.warn(message);
    else
      fmt::print(stderr, "tpdecode: warning: {}\n", message);
  }

  void load() {
    try {
      for (TuneEntry& t : read_tune_file(options.cache_path))
        entries[id_of(t.key)] = Entry{true, true, t.key, t.decision};
    } catch (const Error& e) {
      entries.clear();
      file_usable = false;
      // "tuning cache" first: `tpdecode tune` tells the file's warnings by it.
      warn(fmt::format("tuning cache ignored and left as it is ({}); deciding without it", e.what()));
    }
  }

  // Rewrites the file with every persisted decision, keeping what other processes
  // wrote there since (ours win on the same key). Caller holds `mutex`.
  void save() {
    if (options.cache_path.empty() || !file_usable) return;
    try {
      std::map<std::string, TuneEntry> merged;
      for (const TuneEntry& t : read_tune_file(options.cache_path)) merged[id_of(t.key)] = t;
      for (const auto& [id, e] : entries)
        if (e.ready && e.persist) merged[id] = TuneEntry{e.key, e.decision};
      std::vector<TuneEntry> all;
      for (auto& [id, t] : merged) all.push_back(t);
      write_tune_file(options.cache_path, all);
    } catch (const Error& e) {
      if (!write_failed) warn(fmt::format("tuning cache not saved ({}); decisions stay in memory", e.what()));
      write_failed = true;
    }
  }
};

GemmTuner::GemmTuner(GemmTunerOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  if (!impl_->options.cache_path.empty()) impl_->load();
}

GemmTuner::~GemmTuner() = default;

std::shared_ptr<GemmTuner> GemmTuner::shared() {
  static const std::shared_ptr<GemmTuner> tuner = std::make_shared<GemmTuner>(GemmTunerOptions::from_env());
  return tuner;
}

bool GemmTuner::enabled() const { return impl_->options.enabled; }

void GemmTuner::warn(const std::string& message) const { impl_->warn(message); }

std::optional<GemmDecision> GemmTuner::cached(const GemmKey& key) const {
  std::lock_guard lock(impl_->mutex);
  const auto it = impl_->entries.find(id_of(key));
  if (it == impl_->entries.end() || !it->second.ready) return std::nullopt;
  return it->second.decision;
}

void GemmTuner::insert(const GemmKey& key, const GemmDecision& d) {
  std::lock_guard lock(impl_->mutex);
  impl_->entries[id_of(key)] = Impl::Entry{true, true, key, d};
  impl_->decided.notify_all();
  impl_->save();
}

GemmDecision GemmTuner::decide(const GemmKey& key, int device, const std::vector<GemmDecision>& candidates,
                               const GemmMeasure& measure, const GemmDecision& rule) {
  const std::string id = id_of(key);
  std::unique_lock lock(impl_->mutex);
  for (auto it = impl_->entries.find(id); it != impl_->entries.end(); it = impl_->entries.find(id)) {
    if (it->second.ready) return it->second.decision;
    impl_->decided.wait(lock);
  }
  if (!impl_->options.enabled || !measure || candidates.empty()) return rule;
  impl_->entries[id] = Impl::Entry{false, false, key, rule};
  std::mutex& device_lock = impl_->device_locks[device];
  lock.unlock();

  GemmDecision chosen = rule;
  bool tuned = false;
  try {
    std::lock_guard measuring(device_lock);
    const auto start = std::chrono::steady_clock::now();
    std::unique_ptr<GemmTiming> timing = measure(candidates);
    check<Error>(timing != nullptr, "no timing");
    const int replays = std::max(1, timing->replays());
    std::vector<std::size_t> all(candidates.size());
    std::iota(all.begin(), all.end(), std::size_t{0});
    const GemmSamples phase1 = timing->time(all, replays);
    check<Error>(phase1.size() == candidates.size(), "{} samples for {} candidates", phase1.size(), candidates.size());
    GemmChoice choice = choose_fastest(phase1);
    check<Error>(choice.winner != kNoCandidate, "no candidate ran");
    // Phase 2: the finalists in rounds, while the rounds after the first two fit in
    // what phase 1 took (a round is predicted to take as long as the last one).
    const double phase1_ms = ms_since(start);
    const auto phase2 = std::chrono::steady_clock::now();
    double last_round_ms = 0;
    std::map<std::size_t, std::vector<double>> phase2_samples;  // per finalist, for the trace
    const GemmRetime retime = [&](const std::vector<std::size_t>& finalists) {
      const auto round = std::chrono::steady_clock::now();
      GemmSamples s = timing->time(finalists, replays);
      check<Error>(s.size() == finalists.size(), "{} samples for {} finalists", s.size(), finalists.size());
      last_round_ms = ms_since(round);
      if (impl_->options.trace)
        for (std::size_t f = 0; f < finalists.size(); ++f)
          phase2_samples[finalists[f]].insert(phase2_samples[finalists[f]].end(), s[f].begin(), s[f].end());
      return s;
    };
    const auto more = [&] { return ms_since(phase2) + last_round_ms <= phase1_ms; };
    const GemmTuneRule rule;
    try {
      choice = choose_gemm(phase1, retime, rule, more);
    } catch (const std::exception& e) {
      choice.finalists = static_cast<int>(gemm_finalists(phase1, rule).size());
      choice.stable = choice.finalists < 2;
      impl_->warn(fmt::format("re-timing the finalists of {} failed ({}); phase 1's fastest runs it", key.describe(),
                              e.what()));
    }
    if (impl_->options.trace) impl_->options.trace(explain(key, candidates, phase1, phase2_samples, choice));
    timing.reset();  // its graphs and weight copies go before the time is read
    chosen = candidates[choice.winner];
    chosen.source = GemmSource::kTuned;
    chosen.measured_us = static_cast<float>(choice.us);
    chosen.tune_ms = static_cast<float>(ms_since(start));
    chosen.tune_finalists = static_cast<uint8_t>(std::clamp(choice.finalists, 0, 255));
    chosen.tune_rounds = static_cast<uint8_t>(std::clamp(choice.rounds, 0, 255));
    chosen.tune_stable = choice.stable;
    tuned = true;
  } catch (const std::exception& e) {
    impl_->warn(fmt::format("tuning {} failed ({}); the static rule runs it", key.describe(), e.what()));
  }

  lock.lock();
  impl_->entries[id] = Impl::Entry{true, tuned, key, chosen};
  impl_->decided.notify_all();
  if (tuned) impl_->save();
  return chosen;
}

GemmDecision resolve_decision(GemmTuner& tuner, const GemmKey& key, int device,
                              const std::vector<GemmDecision>& candidates, const GemmMeasure& measure,
                              const GemmDecision& rule, const GemmAgreement& agree) {
  const GemmDecision local = tuner.decide(key, device, candidates, measure, rule);
  if (!agree) return local;
  GemmDecision agreed = agree(key, local);
  if (!agreed.same_path(local)) agreed.source = GemmSource::kAgreed;
  return agreed;
}

}  // namespace tpdecode
