// GemmTuner on the CPU, with fake timers: it keeps the measured-fastest candidate,
// decides a key once however many threads ask, never measures twice at once on a
// device, round-trips its cache file, survives a corrupt or unwritable file, lets
// the ranks of a team agree on one decision, and decides chain links apart.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "cpu/rank0_broadcast.hpp"
#include "gemm/gemm_tactic.hpp"
#include "gemm/tune_file.hpp"
#include "gemm/wgmma_plan.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/gemm_tuner.hpp"

namespace tpdecode {
namespace {

GemmKey key_of(int64_t n, int bucket = 3, std::string device = "NVIDIA H200") {
  return {std::move(device), 132, "tpdecode test", n, 7168, bucket, DType::kBF16};
}

GemmDecision lt(uint64_t word) {
  GemmDecision d;
  d.path = GemmPath::kCublasLt;
  d.lt_algo = {word, 1, 2, 3, 4, 5, 6, ~word};
  return d;
}

const std::vector<GemmDecision> kCandidates = {warp_decision(1), warp_decision(8), warp_decision(3), warp_decision(5), cublas_decision(), lt(0x1234)};

// A timing where every replay of candidate i takes us[i].
class ConstantTiming final : public GemmTiming {
 public:
  explicit ConstantTiming(std::vector<double> us) : us_(std::move(us)) {}
  std::vector<std::vector<double>> time(const std::vector<std::size_t>& which, int replays) override {
    std::vector<std::vector<double>> out;
    for (std::size_t i : which) out.emplace_back(static_cast<std::size_t>(replays), us_.at(i));
    return out;
  }
  int replays() const override { return 5; }

 private:
  std::vector<double> us_;
};

// A measure whose timing gives the times `times` returns for the candidates.
GemmMeasure constant(std::function<std::vector<double>(const std::vector<GemmDecision>&)> times) {
  return [times = std::move(times)](const std::vector<GemmDecision>& c) -> std::unique_ptr<GemmTiming> {
    return std::make_unique<ConstantTiming>(times(c));
  };
}

// A fake timer: fixed times per candidate, counting its calls.
struct FakeTimer {
  std::vector<double> us;
  std::atomic<int> calls{0};
  GemmMeasure measure() {
    return constant([this](const std::vector<GemmDecision>& c) {
      ++calls;
      EXPECT_EQ(c.size(), us.size());
      return us;
    });
  }
};

// Warnings captured instead of printed.
struct Warnings {
  std::mutex mutex;
  std::vector<std::string> seen;
  GemmWarning sink() {
    return [this](const std::string& m) {
      std::lock_guard lock(mutex);
      seen.push_back(m);
    };
  }
  std::size_t count() {
    std::lock_guard lock(mutex);
    return seen.size();
  }
};

// A file path of its own, removed at the end.
struct TempFile {
  std::string path;
  explicit TempFile(const char* name)
      : path((std::filesystem::temp_directory_path() / (std::string(name) + "." + std::to_string(::getpid()))).string()) {
    std::filesystem::remove(path);
  }
  ~TempFile() { std::filesystem::remove(path); }
  std::string text() const {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
};

TEST(GemmTuner, PicksTheMeasuredFastest) {
  GemmTuner tuner;
  FakeTimer timer{{20.0, 12.0, 10.5, 11.0, 10.6, 30.0}};
  const GemmDecision d = tuner.decide(key_of(4608), 0, kCandidates, timer.measure(), cublas_decision());
  EXPECT_TRUE(d.same_path(warp_decision(3)));
  EXPECT_EQ(d.source, GemmSource::kTuned);
  EXPECT_FLOAT_EQ(d.measured_us, 10.5f);
  EXPECT_GE(d.tune_ms, 0.0f);
  // Decided once: the next call, and cached(), give it without measuring.
  EXPECT_TRUE(tuner.decide(key_of(4608), 0, kCandidates, timer.measure(), cublas_decision()).same_path(d));
  EXPECT_EQ(timer.calls, 1);
  ASSERT_TRUE(tuner.cached(key_of(4608)).has_value());
  EXPECT_TRUE(tuner.cached(key_of(4608))->same_path(d));
  // Another bucket, another device name or another shape is another key.
  EXPECT_FALSE(tuner.cached(key_of(4608, 4)).has_value());
  EXPECT_FALSE(tuner.cached(key_of(4608, 3, "NVIDIA H100")).has_value());
  EXPECT_FALSE(tuner.cached(key_of(4609)).has_value());
  // The fastest wins wherever it is in the list.
  FakeTimer last{{20.0, 12.0, 10.5, 11.0, 10.6, 9.9}};
  EXPECT_TRUE(tuner.decide(key_of(2112), 0, kCandidates, last.measure(), cublas_decision()).same_path(lt(0x1234)));
}

TEST(GemmTuner, SkipsFailedCandidatesAndFallsBackToTheRule) {
  Warnings warnings;
  GemmTunerOptions o;
  o.warn = warnings.sink();
  GemmTuner tuner(o);
  const double inf = std::numeric_limits<double>::infinity();
  FakeTimer some{{inf, std::nan(""), 0.0, -1.0, 15.0, 14.0}};
  EXPECT_TRUE(tuner.decide(key_of(1), 0, kCandidates, some.measure(), cublas_decision()).same_path(lt(0x1234)));
  EXPECT_EQ(warnings.count(), 0u);

  FakeTimer none{{inf, inf, inf, inf, inf, inf}};
  const GemmDecision rule = warp_decision(8);
  const GemmDecision d = tuner.decide(key_of(2), 0, kCandidates, none.measure(), rule);
  EXPECT_TRUE(d.same_path(rule));
  EXPECT_EQ(d.source, GemmSource::kRule);
  EXPECT_EQ(warnings.count(), 1u);

  auto throwing = [](const std::vector<GemmDecision>&) -> std::unique_ptr<GemmTiming> { throw Error("device lost"); };
  EXPECT_TRUE(tuner.decide(key_of(3), 0, kCandidates, throwing, rule).same_path(rule));
  EXPECT_EQ(warnings.count(), 2u);
  // The failure is remembered: no second attempt for the key.
  FakeTimer later{{1, 1, 1, 1, 1, 1}};
  EXPECT_TRUE(tuner.decide(key_of(3), 0, kCandidates, later.measure(), rule).same_path(rule));
  EXPECT_EQ(later.calls, 0);
}

TEST(GemmTuner, DisabledTuningUsesTheRule) {
  GemmTunerOptions o;
  o.enabled = false;
  GemmTuner tuner(o);
  FakeTimer timer{{1, 2, 3, 4, 5, 6}};
  const GemmDecision d = tuner.decide(key_of(4608), 0, kCandidates, timer.measure(), warp_decision(4));
  EXPECT_TRUE(d.same_path(warp_decision(4)));
  EXPECT_EQ(d.source, GemmSource::kRule);
  EXPECT_EQ(timer.calls, 0);
  EXPECT_FALSE(tuner.cached(key_of(4608)).has_value());
}

TEST(GemmTuner, OptionsFromTheEnvironment) {
  ::setenv("TPDECODE_TUNE", "0", 1);
  ::setenv("TPDECODE_TUNE_CACHE", "/tmp/somewhere.json", 1);
  GemmTunerOptions o = GemmTunerOptions::from_env();
  EXPECT_FALSE(o.enabled);
  EXPECT_EQ(o.cache_path, "/tmp/somewhere.json");
  ::setenv("TPDECODE_TUNE", "1", 1);
  ::unsetenv("TPDECODE_TUNE_CACHE");
  o = GemmTunerOptions::from_env();
  EXPECT_TRUE(o.enabled);
  EXPECT_TRUE(o.cache_path.empty());
  ::unsetenv("TPDECODE_TUNE");
  EXPECT_TRUE(GemmTunerOptions::from_env().enabled);
  EXPECT_FALSE(GemmTunerOptions::from_env().trace);
  ::setenv("TPDECODE_TUNE_TRACE", "1", 1);
  EXPECT_TRUE(GemmTunerOptions::from_env().trace);
  ::unsetenv("TPDECODE_TUNE_TRACE");
}

// The trace names every candidate with its phase-1 median and fastest sample,
// fastest median first, the
// finalists' phase-2 medians and the choice; a decision from the cache is not traced.
TEST(GemmTuner, TraceExplainsATimedDecision) {
  Warnings traces;
  GemmTunerOptions o;
  o.trace = traces.sink();
  GemmTuner tuner(o);
  FakeTimer timer{{20.0, 12.0, 10.5, 11.0, 10.6, 30.0}};
  const GemmDecision d = tuner.decide(key_of(4608), 0, kCandidates, timer.measure(), cublas_decision());
  ASSERT_EQ(traces.count(), 1u);
  const std::string& text = traces.seen[0];
  EXPECT_NE(text.find(key_of(4608).describe()), std::string::npos) << text;
  std::size_t last = 0;
  for (std::size_t i : {2, 4, 3, 1, 0, 5}) {  // by median
    const std::size_t at = text.find(describe(kCandidates[i]));
    ASSERT_NE(at, std::string::npos) << describe(kCandidates[i]) << " in " << text;
    EXPECT_GT(at, last) << text;
    last = at;
  }
  EXPECT_NE(text.find("    10.50 (    10.50)  " + describe(d)), std::string::npos) << text;  // median (fastest)
  EXPECT_NE(text.find(describe(d) + "  (phase 2: 10.50"), std::string::npos) << text;  // 10.5, 10.6 within 5 %
  EXPECT_NE(text.find(describe(kCandidates[4]) + "  (phase 2: 10.60"), std::string::npos) << text;
  EXPECT_EQ(text.find(describe(kCandidates[1]) + "  (phase 2"), std::string::npos) << text;  // 12: not a finalist
  EXPECT_EQ(text.find("<- chosen"), text.rfind("<- chosen"));
  EXPECT_NE(text.find("(phase 2: 10.50 over 10 samples)  <- chosen"), std::string::npos) << text;
  tuner.decide(key_of(4608), 0, kCandidates, timer.measure(), cublas_decision());
  EXPECT_EQ(traces.count(), 1u);
}

TEST(GemmTuner, ConcurrentCallersOfOneKeyDecideOnce) {
  GemmTuner tuner;
  std::atomic<int> calls{0};
  auto slow = constant([&](const std::vector<GemmDecision>& c) {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::vector<double> us(c.size(), 20.0);
    us[3] = 10.0;
    return us;
  });
  std::vector<GemmDecision> got(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] { got[static_cast<std::size_t>(t)] = tuner.decide(key_of(4608), 0, kCandidates, slow, cublas_decision()); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(calls, 1);
  for (const GemmDecision& d : got) EXPECT_TRUE(d.same_path(warp_decision(5)));
}

TEST(GemmTuner, MeasurementsOnOneDeviceNeverOverlap) {
  GemmTuner tuner;
  std::atomic<int> active{0}, most{0};
  // The measurement lasts from preparing the candidates to the last re-timing.
  class Watched final : public GemmTiming {
   public:
    Watched(std::atomic<int>& active, std::atomic<int>& most) : active_(active) {
      const int now = ++active_;
      most = std::max(most.load(), now);
    }
    ~Watched() override { --active_; }
    std::vector<std::vector<double>> time(const std::vector<std::size_t>& which, int replays) override {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::vector<std::vector<double>> out;
      for (std::size_t i : which) out.emplace_back(static_cast<std::size_t>(replays), 1.0 + 0.001 * static_cast<double>(i));
      return out;
    }
    int replays() const override { return 3; }

   private:
    std::atomic<int>& active_;
  };
  auto measure = [&](const std::vector<GemmDecision>&) -> std::unique_ptr<GemmTiming> {
    return std::make_unique<Watched>(active, most);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&, t] { tuner.decide(key_of(1000 + t), /*device*/ 0, kCandidates, measure, cublas_decision()); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(most, 1);
}

TEST(GemmTuner, CacheRoundTrips) {
  const TempFile file("tpdecode_tune_roundtrip");
  GemmTunerOptions o;
  o.cache_path = file.path;
  GemmDecision a, b;
  {
    GemmTuner first(o);
    FakeTimer ta{{9, 8, 7, 6, 5, 4}};  // the cuBLASLt algorithm wins
    a = first.decide(key_of(4608, 0), 0, kCandidates, ta.measure(), cublas_decision());
    FakeTimer tb{{9, 8, 3, 6, 5, 4}};  // warp 3 wins
    b = first.decide(key_of(2112, 7), 0, kCandidates, tb.measure(), cublas_decision());
    GemmKey shared = key_of(2112, 7);
    shared.sharing = 8;
    FakeTimer tc{{9, 2, 3, 6, 5, 4}};  // warp 8 wins for 8 ranks on one GPU
    first.decide(shared, 0, kCandidates, tc.measure(), cublas_decision());
    GemmKey invariant = key_of(2112, 7);
    invariant.invariant = true;
    FakeTimer td{{9, 8, 7, 2, 5, 4}};  // the batch-invariant order of the same shape and bucket
    first.decide(invariant, 0, kCandidates, td.measure(), cublas_decision());
  }
  ASSERT_TRUE(std::filesystem::exists(file.path));
  GemmTuner second(o);
  FakeTimer never{{1, 1, 1, 1, 1, 1}};
  const GemmDecision a2 = second.decide(key_of(4608, 0), 0, kCandidates, never.measure(), cublas_decision());
  const GemmDecision b2 = second.decide(key_of(2112, 7), 0, kCandidates, never.measure(), cublas_decision());
  EXPECT_EQ(never.calls, 0);
  EXPECT_TRUE(a2.same_path(a));
  EXPECT_TRUE(a2.same_path(lt(0x1234)));
  EXPECT_EQ(a2.lt_algo, lt(0x1234).lt_algo);
  EXPECT_TRUE(b2.same_path(warp_decision(3)));
  EXPECT_EQ(a2.source, GemmSource::kCache);
  EXPECT_FLOAT_EQ(a2.measured_us, a.measured_us);
  EXPECT_FLOAT_EQ(b2.tune_ms, b.tune_ms);
  // Keyed by every field: another version, or the same shape as a chain link, finds nothing.
  GemmKey other = key_of(4608, 0);
  other.version = "tpdecode next";
  EXPECT_FALSE(second.cached(other).has_value());
  GemmKey link = key_of(4608, 0);
  link.chain = true;
  EXPECT_FALSE(second.cached(link).has_value());
  // A shared GPU's decision is its own key, and persists as such.
  GemmKey shared = key_of(2112, 7);
  shared.sharing = 8;
  ASSERT_TRUE(second.cached(shared).has_value());
  EXPECT_TRUE(second.cached(shared)->same_path(warp_decision(8)));
  shared.sharing = 4;
  EXPECT_FALSE(second.cached(shared).has_value());
  // So is a batch-invariant order: beside the default decision of its shape and bucket.
  GemmKey invariant = key_of(2112, 7);
  invariant.invariant = true;
  ASSERT_TRUE(second.cached(invariant).has_value());
  EXPECT_TRUE(second.cached(invariant)->same_path(kCandidates[3]));
  EXPECT_TRUE(second.cached(key_of(2112, 7))->same_path(warp_decision(3)));
  EXPECT_NE(invariant.describe().find("batch-invariant"), std::string::npos);
}

// A chain link's decision charges the stock candidates what they cost their
// neighbours: an engine within kChainBoundaryUs of cuBLAS wins as a link and loses
// alone; one slower by more loses both ways. Both keys persist apart.
TEST(GemmTuner, ChainLinksChargeStockCandidates) {
  const std::vector<double> us = {20.0, 11.0, 30.0, 30.0, 10.0, 10.5};  // warp 8 trails cuBLAS by 1 us
  const std::vector<double> charged = charge_chain_boundaries(kCandidates, 8, us);
  for (std::size_t i = 0; i < us.size(); ++i) {
    const bool stock = kCandidates[i].path == GemmPath::kCublas || kCandidates[i].path == GemmPath::kCublasLt;
    EXPECT_DOUBLE_EQ(charged[i], us[i] + (stock ? kChainBoundaryUs : 0.0)) << describe(kCandidates[i]);
  }
  // The wide form is charged as a stock link (the next link's CTAs do not fit beside
  // it), and so is the other wgmma form with a ring beyond half an SM; a half-SM ring
  // is not.
  const int half = wgmma::stages_within(1, 32, kWgmmaHalfBudget), full = wgmma::stages_within(1, 32, kWgmmaFullBudget);
  ASSERT_GT(full, half);
  const std::vector<GemmDecision> wgmma = {wgmma_wide_decision(1, 160, 8), wgmma_decision(2, 1, half),
                                           wgmma_decision(1, 1, full)};
  EXPECT_EQ(charge_chain_boundaries(wgmma, 28, {5.0, 5.0, 5.0}),
            (std::vector<double>{5.0 + kChainBoundaryUs, 5.0, 5.0 + kChainBoundaryUs}));
  EXPECT_FALSE(charged_in_chains(wgmma_decision(1, 1, half + 1), 8));  // 8 tokens: a smaller stage
  EXPECT_THROW(charge_chain_boundaries(kCandidates, 8, {1.0}), InvalidArgument);

  const TempFile file("tpdecode_tune_chain");
  GemmTunerOptions o;
  o.cache_path = file.path;
  GemmKey alone = key_of(7168, 1), link = key_of(7168, 1);
  link.chain = true;
  {
    GemmTuner tuner(o);
    FakeTimer t{us};
    EXPECT_TRUE(tuner.decide(alone, 0, kCandidates, t.measure(), warp_decision(1)).same_path(cublas_decision()));
    const GemmMeasure as_link = [&](const std::vector<GemmDecision>& c) {
      return charge_chain_boundaries(c, 8, std::make_unique<ConstantTiming>(us));
    };
    EXPECT_TRUE(tuner.decide(link, 0, kCandidates, as_link, cublas_decision()).same_path(warp_decision(8)));
    std::vector<double> far = us;
    far[1] = 10.0 + kChainBoundaryUs + 0.5;  // beyond the charge: cuBLAS stays
    const GemmMeasure far_link = [&](const std::vector<GemmDecision>& c) {
      return charge_chain_boundaries(c, 8, std::make_unique<ConstantTiming>(far));
    };
    GemmKey other = link;
    other.n = 2304;
    EXPECT_TRUE(tuner.decide(other, 0, kCandidates, far_link, warp_decision(1)).same_path(cublas_decision()));
  }
  GemmTuner reread(o);
  ASSERT_TRUE(reread.cached(alone).has_value());
  ASSERT_TRUE(reread.cached(link).has_value());
  EXPECT_TRUE(reread.cached(alone)->same_path(cublas_decision()));
  EXPECT_TRUE(reread.cached(link)->same_path(warp_decision(8)));
  // A file written before chain keys (no "chain" field) holds decisions for GEMMs alone.
  const std::string old = R"({"format": "tpdecode-gemm-tune/1", "entries": [{"device": "NVIDIA H200", "sms": 132,
      "version": "tpdecode test", "n": 4608, "k": 7168, "m_min": 5, "m_max": 8, "dtype": "bf16", "path": "warp",
      "split": 4, "lt_algo": "%s", "us": 1, "tune_ms": 1}]})";
  const std::size_t at = old.find("%s");
  { std::ofstream(file.path) << old.substr(0, at) + std::string(128, '0') + old.substr(at + 2); }
  GemmTuner legacy(o);
  ASSERT_TRUE(legacy.cached(key_of(4608, 3)).has_value());
  EXPECT_TRUE(legacy.cached(key_of(4608, 3))->same_path(warp_decision(4)));
}

TEST(GemmTuner, SavingKeepsWhatOtherProcessesWrote) {
  const TempFile file("tpdecode_tune_merge");
  write_tune_file(file.path, {{key_of(777, 2, "NVIDIA H100"), warp_decision(2)}});
  GemmTunerOptions o;
  o.cache_path = file.path;
  GemmTuner tuner(o);
  FakeTimer t{{9, 8, 7, 6, 5, 4}};
  tuner.decide(key_of(4608), 0, kCandidates, t.measure(), cublas_decision());
  // Another process adds an entry meanwhile; our next save keeps it.
  std::vector<TuneEntry> now = read_tune_file(file.path);
  now.push_back({key_of(888), warp_decision(6)});
  write_tune_file(file.path, now);
  tuner.insert(key_of(999), warp_decision(4));
  const std::vector<TuneEntry> all = read_tune_file(file.path);
  EXPECT_EQ(all.size(), 4u);
  int found = 0;
  for (const TuneEntry& e : all)
    found += (e.key == key_of(777, 2, "NVIDIA H100") && e.decision.same_path(warp_decision(2))) +
             (e.key == key_of(888) && e.decision.same_path(warp_decision(6))) + (e.key == key_of(4608)) +
             (e.key == key_of(999) && e.decision.same_path(warp_decision(4)));
  EXPECT_EQ(found, 4);
}

TEST(GemmTuner, CorruptCacheWarnsIsIgnoredAndKept) {
  const TempFile file("tpdecode_tune_corrupt");
  for (const std::string& bad :
       {std::string("{ not json"), std::string(R"({"format": "other", "entries": []})"),
        std::string(R"({"format": "tpdecode-gemm-tune/1", "entries": [{"device": "x"}]})"),
        // Rows that are not a bucket, written by this version.
        R"({"format": "tpdecode-gemm-tune/1", "entries": [{"device": "NVIDIA H200", "sms": 132, "version": ")" +
            gemm_library_version() + R"(", "n": 16, "k": 128, "m_min": 3, "m_max": 5, "dtype": "bf16",
           "path": "warp", "split": 1, "lt_algo": ")" + std::string(128, '0') + R"(", "us": 1, "tune_ms": 1}]})"}) {
    SCOPED_TRACE(bad);
    { std::ofstream(file.path) << bad; }
    Warnings warnings;
    GemmTunerOptions o;
    o.cache_path = file.path;
    o.warn = warnings.sink();
    GemmTuner tuner(o);
    ASSERT_EQ(warnings.count(), 1u);
    // `tpdecode tune` tells the file's warnings from the others by this beginning.
    EXPECT_EQ(warnings.seen[0].rfind("tuning cache", 0), 0u) << warnings.seen[0];
    FakeTimer t{{9, 8, 7, 6, 5, 4}};
    EXPECT_TRUE(tuner.decide(key_of(4608), 0, kCandidates, t.measure(), cublas_decision()).same_path(lt(0x1234)));
    EXPECT_EQ(t.calls, 1);
    EXPECT_EQ(file.text(), bad);  // never overwritten

    o.enabled = false;  // no tuning: the static rule
    GemmTuner off(o);
    EXPECT_TRUE(off.decide(key_of(4608), 0, kCandidates, t.measure(), warp_decision(8)).same_path(warp_decision(8)));
  }
}

// A file written by a version with another engine or other buckets: its entries of
// a path this library lacks or of rows that are not a bucket here are skipped
// without a warning; the others load, and a save keeps only what this library can read.
TEST(GemmTuner, EntriesOfAPathOrBucketThisVersionLacksAreSkipped) {
  const TempFile file("tpdecode_tune_old_path");
  const std::string text = R"({"format": "tpdecode-gemm-tune/1", "entries": [
      {"device": "NVIDIA H200", "sms": 132, "version": "tpdecode test", "n": 4608, "k": 7168, "m_min": 5,
       "m_max": 8, "dtype": "bf16", "path": "stream", "split": 1, "variant": 2, "lt_algo": "%s", "us": 1,
       "tune_ms": 1},
      {"device": "NVIDIA H200", "sms": 132, "version": "tpdecode test", "n": 1536, "k": 7168, "m_min": 25,
       "m_max": 32, "dtype": "bf16", "path": "warp", "split": 2, "lt_algo": "%s", "us": 1, "tune_ms": 1},
      {"device": "NVIDIA H200", "sms": 132, "version": "tpdecode test", "n": 2112, "k": 7168, "m_min": 5,
       "m_max": 8, "dtype": "bf16", "path": "warp", "split": 6, "lt_algo": "%s", "us": 1, "tune_ms": 1}]})";
  std::string filled = text;
  for (std::size_t at = filled.find("%s"); at != std::string::npos; at = filled.find("%s"))
    filled.replace(at, 2, std::string(128, '0'));
  { std::ofstream(file.path) << filled; }
  Warnings warnings;
  GemmTunerOptions o;
  o.cache_path = file.path;
  o.warn = warnings.sink();
  GemmTuner tuner(o);
  EXPECT_EQ(warnings.count(), 0u);
  EXPECT_FALSE(tuner.cached(key_of(4608, 3)).has_value());
  for (int m = 25; m <= 32; ++m) EXPECT_FALSE(tuner.cached(key_of(1536, gemm_m_bucket(m))).has_value());
  ASSERT_TRUE(tuner.cached(key_of(2112, 3)).has_value());
  EXPECT_TRUE(tuner.cached(key_of(2112, 3))->same_path(warp_decision(6)));
  tuner.insert(key_of(999), warp_decision(4));
  EXPECT_EQ(read_tune_file(file.path).size(), 2u);
}

// A wgmma decision's launch shape survives the file.
TEST(GemmTuner, WgmmaDecisionsRoundTrip) {
  const TempFile file("tpdecode_tune_wgmma");
  GemmTunerOptions o;
  o.cache_path = file.path;
  GemmTuner(o).insert(key_of(2112, 9), wgmma_decision(5, 2, 6));
  GemmTuner(o).insert(key_of(4608, 8), wgmma_decision(3, 1, 11, 72));
  GemmTuner reread(o);
  ASSERT_TRUE(reread.cached(key_of(2112, 9)).has_value());
  EXPECT_TRUE(reread.cached(key_of(2112, 9))->same_path(wgmma_decision(5, 2, 6)));
  EXPECT_TRUE(reread.cached(key_of(4608, 8))->same_path(wgmma_decision(3, 1, 11, 72)));
}

TEST(GemmTuner, UnwritableCacheWarnsOnce) {
  Warnings warnings;
  GemmTunerOptions o;
  o.cache_path = "/nonexistent-directory-of-tpdecode/tune.json";
  o.warn = warnings.sink();
  GemmTuner tuner(o);
  EXPECT_EQ(warnings.count(), 0u);  // a missing file is an empty cache
  FakeTimer t{{9, 8, 7, 6, 5, 4}};
  EXPECT_TRUE(tuner.decide(key_of(1), 0, kCandidates, t.measure(), cublas_decision()).same_path(lt(0x1234)));
  EXPECT_TRUE(tuner.decide(key_of(2), 0, kCandidates, t.measure(), cublas_decision()).same_path(lt(0x1234)));
  EXPECT_EQ(warnings.count(), 1u);
  EXPECT_TRUE(tuner.cached(key_of(2)).has_value());
}

// Ranks as separate processes (a tuner each), measuring different winners; the
// agreement broadcasts rank 0's decision, as an NCCL broadcast would.
TEST(GemmTuner, EveryRankOfATeamRunsTheSameDecision) {
  constexpr int kRanks = 4;
  test::Rank0Broadcast<GemmDecision> broadcast;
  std::vector<GemmDecision> local(kRanks), agreed(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      GemmTuner tuner;  // this rank's process
      std::vector<double> us(kCandidates.size(), 50.0);
      us[static_cast<std::size_t>(r)] = 10.0;  // each rank measures another winner
      const GemmMeasure measure = constant([us](const std::vector<GemmDecision>&) { return us; });
      local[static_cast<std::size_t>(r)] = tuner.decide(key_of(4608), 0, kCandidates, measure, cublas_decision());
      const GemmAgreement agree = [&, r](const GemmKey&, const GemmDecision& mine) {
        return broadcast.exchange(r, mine);
      };
      agreed[static_cast<std::size_t>(r)] =
          resolve_decision(tuner, key_of(4608), 0, kCandidates, measure, cublas_decision(), agree);
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(local[static_cast<std::size_t>(r)].same_path(kCandidates[static_cast<std::size_t>(r)]));
    EXPECT_TRUE(agreed[static_cast<std::size_t>(r)].same_path(kCandidates[0])) << "rank " << r;
    EXPECT_EQ(agreed[static_cast<std::size_t>(r)].source, r == 0 ? GemmSource::kTuned : GemmSource::kAgreed);
  }
  // Without an agreement, resolve_decision is the rank's own decision.
  GemmTuner alone;
  FakeTimer t{{9, 8, 7, 6, 5, 4}};
  EXPECT_TRUE(resolve_decision(alone, key_of(1), 0, kCandidates, t.measure(), cublas_decision(), {}).same_path(lt(0x1234)));
}

TEST(GemmTuner, KeysDescribeThemselves) {
  EXPECT_EQ(key_of(2112, 3).describe(), "NVIDIA H200 (132 SMs) 2112x7168 M 5-8 bf16");
  GemmKey link = key_of(2112, 3);
  link.chain = true;
  EXPECT_EQ(link.describe(), "NVIDIA H200 (132 SMs) 2112x7168 M 5-8 bf16 chain");
  EXPECT_NE(gemm_library_version().find("cuBLASLt"), std::string::npos);
}

}  // namespace
}  // namespace tpdecode
