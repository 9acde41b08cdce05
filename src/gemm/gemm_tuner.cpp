#include "tpdecode/gemm_tuner.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>

#include "core/check.hpp"
#include "gemm/tune_file.hpp"
#include "tpdecode/version.hpp"
#include "tpdecode/cublas_context.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

// Bump when the candidates change (an engine or a tactic added or removed, a
// tactic's meaning changed) or an engine's speed does: decisions measured under
// another revision are not used, so every bucket is decided again among today's
// candidates.
constexpr int kEngineRevision = 6;

// The map key: every field of GemmKey.
std::string id_of(const GemmKey& k) {
  return fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}", k.device, k.sms, k.version, k.n, k.k, k.bucket,
                     dtype_name(k.dtype), k.chain ? "chain" : "alone", k.sharing);
}

}  // namespace

std::string GemmKey::describe() const {
  return fmt::format("{} ({} SMs) {}x{} M {}-{} {}{}{}", device, sms, n, k, gemm_bucket_min(bucket),
                     gemm_bucket_max(bucket), dtype_name(dtype), chain ? " chain" : "",
                     sharing > 1 ? fmt::format(", shared by {}", sharing) : "");
}

std::vector<double> charge_chain_boundaries(const std::vector<GemmDecision>& candidates, std::vector<double> us) {
  check(us.size() == candidates.size(), "chain charge: {} times for {} candidates", us.size(), candidates.size());
  for (std::size_t i = 0; i < us.size(); ++i)
    if (candidates[i].path == GemmPath::kCublas || candidates[i].path == GemmPath::kCublasLt) us[i] += kChainBoundaryUs;
  return us;
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
    const std::vector<double> us = measure(candidates);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    check<Error>(us.size() == candidates.size(), "{} times for {} candidates", us.size(), candidates.size());
    std::size_t best = us.size();
    for (std::size_t i = 0; i < us.size(); ++i)
      if (std::isfinite(us[i]) && us[i] > 0 && (best == us.size() || us[i] < us[best])) best = i;
    check<Error>(best < us.size(), "no candidate ran");
    chosen = candidates[best];
    chosen.source = GemmSource::kTuned;
    chosen.measured_us = static_cast<float>(us[best]);
    chosen.tune_ms = static_cast<float>(ms);
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
