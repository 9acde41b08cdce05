// tpdecode tune: pre-tunes DecodeGemm for a list of shapes (the drafter's per-rank
// linears at the given TPs, any --shape) and every M bucket, as links of a PDL chain
// (DecodeGemm::set_chain) unless --alone, and writes the
// decisions to the tuning cache file that TPDECODE_TUNE_CACHE names at run time.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/check.hpp"
#include "core/random_fill.hpp"
#include "gemm_shapes.hpp"
#include "json_file.hpp"
#include "tpdecode/decode_gemm.hpp"
#include "tpdecode/device_buffer.hpp"

namespace tpdecode::cli {
namespace {

struct Options {
  std::vector<int> tps;
  std::vector<std::string> shapes;
  std::vector<int> ms = {1, 2, 4, 8, 12, 16, 24, 32, 48, 64};  // one per bucket
  std::string cache;
  bool fresh = false;
  bool alone = false;  // decide for GEMMs alone rather than for links of a PDL chain
  std::string json;
};

struct Row {
  GemmShape shape;
  GemmKey key;
  GemmDecision decision;
  std::string tactic;
};

void run(const Options& o) {
  // Every option checked before the GPU: a bad one is refused at once, not after a run.
  std::string cache = o.cache;
  if (cache.empty())
    if (const char* env = std::getenv("TPDECODE_TUNE_CACHE")) cache = env;
  check(!cache.empty(), "tune: name the cache file with --cache or TPDECODE_TUNE_CACHE");
  std::string cache_text = cache;
  const std::string unwritable = writable_file(true)(cache_text);
  check(unwritable.empty(), "tune: the cache file: {}", unwritable);
  std::vector<GemmShape> shapes;
  for (int tp : unique_in_order(o.tps)) {
    check(tp == 1 || tp == 2 || tp == 4 || tp == 8, "tune: --tp {} (1, 2, 4, 8)", tp);
    for (const GemmShape& s : drafter_shapes(tp)) shapes.push_back(s);
  }
  for (const std::string& t : unique_in_order(o.shapes)) shapes.push_back(parse_shape(t));
  check(!shapes.empty(), "tune: no shapes (--tp or --shape)");
  for (int m : o.ms) check(m >= 1 && m <= kGemmMaxRows, "tune: --m {} (1..{})", m, kGemmMaxRows);
  const Gpu gpu = require_gpu("tune");

  // Why the file's warnings kept: writing that file is this command's one job, and
  // the tuner only warns where the file is unusable or not saved ("tuning cache
  // ..."); its other warnings (a candidate that failed, say) go to stderr as usual.
  std::vector<std::string> file_problems;
  GemmTunerOptions file_options;
  file_options.cache_path = cache;
  file_options.warn = [&](const std::string& message) {
    if (message.rfind("tuning cache", 0) == 0)
      file_problems.push_back(message);
    else
      fmt::print(stderr, "tpdecode: warning: {}\n", message);
  };
  auto file = std::make_shared<GemmTuner>(file_options);
  check<Error>(file_problems.empty(), "tune: {}: {} (fix or remove the file)", cache,
               file_problems.empty() ? "" : file_problems.front());
  // --fresh: decide in memory, ignoring what the file holds, then record there.
  auto tuner = o.fresh ? std::make_shared<GemmTuner>(GemmTunerOptions{}) : file;
  cudaStream_t stream;
  TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto cublas = std::make_shared<CublasContext>();
  std::vector<Row> rows;
  double total_ms = 0;
  for (const GemmShape& s : shapes) {
    fmt::print(stderr, "{} {} {}x{}\n", s.set, s.name, s.n, s.k);
    const DeviceBuffer w(static_cast<std::size_t>(s.bytes()));
    fill_uniform_bf16(w.get(), s.n * s.k, 42, 0.05f, stream);
    DecodeGemm gemm(TensorView::bf16(w.get(), s.n, s.k), cublas, tuner);
    gemm.set_chain(!o.alone);
    if (!gemm.engine_eligible()) {
      fmt::print(stderr, "  no engine takes {}x{}: cuBLAS runs it, nothing to tune\n", s.n, s.k);
      continue;
    }
    for (int m : o.ms) {
      if (gemm.prepared(m)) continue;  // an earlier M of the same bucket
      gemm.prepare(m, stream);
      Row r{s, gemm.key(m), gemm.decision(m), tactic_of(gemm.decision(m), s.n, s.k, m)};
      if (o.fresh) file->insert(r.key, r.decision);
      total_ms += r.decision.tune_ms;
      rows.push_back(r);
    }
  }
  TPD_CUDA(cudaStreamDestroy(stream));

  fmt::print("\n{:<5} {:<12} {:>6} {:>5} {:>5} {:<7} {:>9} {:>6} {:>8} {:>8}  {}\n", "set", "linear", "N", "K", "M",
             "source", "us", "TB/s", "tune ms", "retimed", "decision");
  int retimed = 0, unstable = 0;
  double most_ms = 0;
  for (const Row& r : rows) {
    const GemmDecision& d = r.decision;
    retimed += d.tune_finalists > 1;
    unstable += d.tune_finalists > 1 && !d.tune_stable;
    most_ms = std::max(most_ms, static_cast<double>(d.tune_ms));
    fmt::print("{:<5} {:<12} {:>6} {:>5} {:>2}-{:<2} {:<7} {:>9.2f} {:>6.2f} {:>8.1f} {:>4}x{:<2}{}  {}\n", r.shape.set,
               r.shape.name, r.shape.n, r.shape.k, gemm_bucket_min(r.key.bucket), gemm_bucket_max(r.key.bucket),
               gemm_source_name(d.source), d.measured_us,
               d.measured_us > 0 ? r.shape.bytes() / (d.measured_us * 1e6) : 0.0, d.tune_ms, d.tune_finalists,
               d.tune_rounds, d.tune_finalists > 1 && !d.tune_stable ? "!" : " ", r.tactic);
  }
  check<Error>(file_problems.empty(), "tune: {}: {}", cache, file_problems.empty() ? "" : file_problems.front());
  fmt::print("\n{} decisions in {} ({:.0f} ms of tuning, at most {:.1f} ms for one; 'cache': already there, not "
             "re-timed — --fresh re-times). retimed = finalists x rounds of phase 2 (1x0: no rival within 5 % in "
             "phase 1); {} decisions re-timed, {} of them ('!') ended at the round cap or the time budget without "
             "two agreeing rounds.\n",
             rows.size(), cache, total_ms, most_ms, retimed, unstable);
  if (!o.json.empty()) {
    nlohmann::json j = nlohmann::json::array();
    for (const Row& r : rows)
      j.push_back({{"set", r.shape.set},
                   {"linear", r.shape.name},
                   {"n", r.shape.n},
                   {"k", r.shape.k},
                   {"m_min", gemm_bucket_min(r.key.bucket)},
                   {"m_max", gemm_bucket_max(r.key.bucket)},
                   {"chain", r.key.chain},
                   {"source", gemm_source_name(r.decision.source)},
                   {"path", gemm_path_name(r.decision.path)},
                   {"tactic", r.tactic},
                   {"us", r.decision.measured_us},
                   {"tune_ms", r.decision.tune_ms},
                   {"finalists", r.decision.tune_finalists},
                   {"rounds", r.decision.tune_rounds},
                   {"stable", r.decision.tune_stable}});
    write_json_file(o.json, j);
  }
}

}  // namespace

void register_tune(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("tune", "pre-tune DecodeGemm for a list of shapes and write the tuning cache");
  auto o = std::make_shared<Options>();
  cmd->add_option("--tp", o->tps, "the drafter's per-rank linears at this TP (repeatable: 1 2 4 8)");
  cmd->add_option("--shape", o->shapes, "a shape NxK (repeatable)");
  cmd->add_option("--m", o->ms, "rows (repeatable; default one per bucket: 1 2 4 8 12 16 24 32 48 64)");
  cmd->add_option("--cache", o->cache, "the cache file (default: $TPDECODE_TUNE_CACHE)")->check(writable_file(true));
  cmd->add_flag("--fresh", o->fresh, "re-time shapes the file already holds");
  cmd->add_flag("--alone", o->alone,
                "decide for GEMMs run alone (default: as links of a PDL chain, the way the drafter's step runs them)");
  cmd->add_option("--json", o->json, "also write the decisions as JSON to this file")->check(writable_file());
  cmd->callback([o] { run(*o); });
}

}  // namespace tpdecode::cli
