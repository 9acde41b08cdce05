// Measured dispatch for DecodeGemm: one decision per (GPU, N, K, M bucket), timed
// on the first eager call and kept in memory (shared by every DecodeGemm of the
// process, thread-safe) and, when TPDECODE_TUNE_CACHE names a file, on disk.
//
// Environment (read once, by GemmTuner::shared()):
//   TPDECODE_TUNE=0          no tuning: the cached decision, else the static rule
//   TPDECODE_TUNE_CACHE=FILE JSON decisions keyed by GPU name, SM count, library
//                            version, N, K, M bucket and dtype; loaded at start,
//                            rewritten after each new decision. A corrupt file is
//                            reported and ignored (never overwritten); an
//                            unwritable one is reported once; neither stops a run.
//   TPDECODE_TUNE_TRACE=1    each decision made by timing explained on stderr: every
//                            candidate's phase-1 median, the finalists' phase-2
//                            medians, the choice (why the dispatch took a path).
//
// Teams: a rank's decision may differ from its peers' (timing noise), and
// replicated GEMMs must stay bitwise identical on every rank. DecodeGemm::
// set_agreement takes a GemmAgreement, called once per bucket on every rank at the
// same point of the program (the first eager call), that returns the decision all
// ranks run (e.g. rank 0's, broadcast with NCCL). Ranks that are threads of one
// process share GemmTuner::shared() and agree without it.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tpdecode/gemm_decision.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode {

// What a decision is keyed by: it carries over between processes and GPUs only
// where every field matches.
struct GemmKey {
  std::string device;   // GPU name, e.g. "NVIDIA H200"
  int sms = 0;
  std::string version;  // gemm_library_version()
  int64_t n = 0;
  int64_t k = 0;
  int bucket = 0;       // gemm_m_bucket(m)
  DType dtype = DType::kBF16;
  bool chain = false;   // decided for a link of a PDL chain (charge_chain_boundaries)
  int sharing = 1;      // ranks whose GEMMs run on this GPU at once (a local team's)
  // A batch-invariant GEMM's summation order for calls mostly of `bucket`'s rows
  // (DecodeGemm::set_batch_invariant): one decision for every row count.
  bool invariant = false;
  bool operator==(const GemmKey&) const = default;
  std::string describe() const;  // e.g. "NVIDIA H200 (132 SMs) 2112x7168 M 5-8 bf16 chain, shared by 8"
};

// What a stock (cuBLAS, cuBLASLt) link costs a chain of PDL kernels beyond its own
// time: it neither lets the next kernel launch early nor starts before the previous
// one has drained, so both boundaries lose their overlap. Measured on an H200
// (`tpdecode bench chain --force warp`, docs/performance.md): the TP 8 chain with its
// 11 stock links replaced by the warp engine took 22.8 us less at M 1 and 17.1 us
// less at M 8, although those links were 0.2-1.0 us slower alone: ~2.3 us a link.
inline constexpr double kChainBoundaryUs = 2.0;
// The decisions charged kChainBoundaryUs at m rows: the stock ones, the wgmma
// engine's wide form, whose CTA leaves no room on its SM for most next links' CTAs
// (all its shared memory; 160-253 registers a thread), so that link's CTAs become
// resident only as it drains (with such links tuned uncharged, the TP 8 chain at M
// 64 took 351.7 us against the stock chain's 330.3; docs/performance.md), and for
// the same reason the weight-as-A form with a ring beyond half an SM's shared memory
// (the TP 4 chain at M 28 with such links uncharged: 494.0 us, the links ~447 alone,
// the stock chain 477.9; charged: 441.2 against 473.9).
bool charged_in_chains(const GemmDecision& d, int m);
// The times a chain link's decision at m rows compares: `us` (per candidate) with
// kChainBoundaryUs added to those charged_in_chains.
std::vector<double> charge_chain_boundaries(const std::vector<GemmDecision>& candidates, int m, std::vector<double> us);

// The tpdecode engines' revision and the cuBLASLt version: decisions made under
// another version are not used.
std::string gemm_library_version();

// Times the candidates of one decision; made by a GemmMeasure (which prepares and
// checks every candidate once), used and destroyed by the tuner on the thread that
// made it.
class GemmTiming {
 public:
  virtual ~GemmTiming() = default;
  // `replays` timed replays of each candidate in `which` (indices into the
  // candidates), interleaved: one replay of each in turn, `replays` times over, so
  // drift over the call falls on all alike. Per entry of `which`, the per-call
  // microseconds of its replays (empty, or values not finite and positive: it failed).
  virtual std::vector<std::vector<double>> time(const std::vector<std::size_t>& which, int replays) = 0;
  // Replays a candidate gets in phase 1 and in each round of phase 2 (fewer where
  // one replay is long).
  virtual int replays() const = 0;
};
// Prepares the candidates for timing (throws where none can be timed at all).
using GemmMeasure = std::function<std::unique_ptr<GemmTiming>(const std::vector<GemmDecision>& candidates)>;
// `timing` with kChainBoundaryUs added to every sample of the charged candidates
// (what a chain link's decision compares).
std::unique_ptr<GemmTiming> charge_chain_boundaries(const std::vector<GemmDecision>& candidates, int m,
                                                    std::unique_ptr<GemmTiming> timing);
// A team's agreement: this rank's decision in, the one every rank runs out.
using GemmAgreement = std::function<GemmDecision(const GemmKey& key, const GemmDecision& local)>;
using GemmWarning = std::function<void(const std::string& message)>;

struct GemmTunerOptions {
  bool enabled = true;     // false: the cached decision, else the static rule
  std::string cache_path;  // empty: decisions stay in memory
  GemmWarning warn;        // empty: "tpdecode: warning: ..." on stderr
  GemmWarning trace;       // empty: no explanation; else each timed decision's, one message
  static GemmTunerOptions from_env();
};

class GemmTuner {
 public:
  explicit GemmTuner(GemmTunerOptions options = {});
  ~GemmTuner();
  GemmTuner(const GemmTuner&) = delete;
  GemmTuner& operator=(const GemmTuner&) = delete;

  // The process's tuner (options from the environment at first use).
  static std::shared_ptr<GemmTuner> shared();

  bool enabled() const;
  // The decision made or loaded for `key`, if any.
  std::optional<GemmDecision> cached(const GemmKey& key) const;
  // The decision for `key`: the cached one; else, with tuning enabled, the fastest
  // of `candidates` as timed by `measure` in two phases (src/gemm/tune_rule.hpp:
  // every candidate a few replays, then the finalists within 5 % re-timed in
  // interleaved rounds until the winner holds for two rounds, at most 6 rounds, and
  // no round begun after the first two once phase 2 would outlast phase 1); source
  // kTuned, with its time, the tuning cost and the re-timing's record; kept, and
  // written to the cache file; else `rule`. A key is decided once: a concurrent
  // caller of the same key waits for the first; measurements on one device never
  // overlap. A measurement that throws in phase 1, or where no candidate ran, is
  // reported and gives `rule` (kept in memory for the key); one that throws in
  // phase 2 is reported and phase 1's fastest is kept.
  GemmDecision decide(const GemmKey& key, int device, const std::vector<GemmDecision>& candidates,
                      const GemmMeasure& measure, const GemmDecision& rule);
  // Records a decision for `key` as if tuned (tools, tests); written to the file.
  void insert(const GemmKey& key, const GemmDecision& d);
  // Reports through the options' warning sink.
  void warn(const std::string& message) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What a rank runs for `key`: tuner.decide(...), then, if `agree` is set, the
// team's agreed decision (source kAgreed where it differs from this rank's).
GemmDecision resolve_decision(GemmTuner& tuner, const GemmKey& key, int device,
                              const std::vector<GemmDecision>& candidates, const GemmMeasure& measure,
                              const GemmDecision& rule, const GemmAgreement& agree);

}  // namespace tpdecode
