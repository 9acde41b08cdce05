// tpdecode bench gemm: DecodeGemm's measured dispatch against every path it could
// have taken, forced, on the drafter's linears (docs/drafter.md, TP 8 and TP 1),
// mid-size weights (gemm_shapes.hpp) and any --shape, for each M. CUDA graphs over
// rotating weight copies (the tuner's rule, weight_rotation.hpp: every call reads
// HBM), median of many replays, and the HBM read ceiling measured in the same run.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/check.hpp"
#include "core/graph_timing.hpp"
#include "core/random_fill.hpp"
#include "core/weight_rotation.hpp"
#include "gemm_shapes.hpp"
#include "json_file.hpp"
#include "read_ceiling.hpp"
#include "tpdecode/decode_gemm.hpp"
#include "tpdecode/device_buffer.hpp"

namespace tpdecode::cli {
namespace {

// The dispatch may be this much slower than the best engine tactic or cuBLAS before
// a row is flagged (the dispatch target: docs/performance.md, "Targets").
constexpr double kDispatchSlack = 1.02;

struct Options {
  std::vector<std::string> sets = {"tp8", "tp1", "mid"};
  std::vector<std::string> shapes;
  std::vector<int> ms = {1, 2, 4, 8, 16, 32, 48, 64};
  bool compare_invariant = false;  // also time the dispatch in batch-invariant mode
  int invariant_rows = DecodeGemm::kInvariantDefaultRows;  // its hint
  int replays = 30;
  std::string json;
};

struct Timed {
  GemmDecision decision;
  std::string tactic;
  double us = 0;  // infinite: it did not run
};

struct Row {
  GemmShape shape;
  int m = 0;
  GemmDecision chosen;  // the dispatch's decision (cuBLAS where no engine takes the row)
  std::string chosen_tactic;
  double ours_us = 0;
  double read_us = 0;         // a plain streaming read of the same weight copies
  std::optional<double> invariant_us;  // --compare-invariant: the batch-invariant decision
  std::string invariant_tactic;
  float invariant_tuned_us = 0;  // the tuner's median of the invariant order (at the hint's bucket; 0: not timed)
  std::vector<Timed> forced;  // every candidate, forced

  double best(bool (*keep)(GemmPath)) const {
    double b = std::numeric_limits<double>::infinity();
    for (const Timed& t : forced)
      if (keep(t.decision.path)) b = std::min(b, t.us);
    return b;
  }
  const Timed* best_timed(bool (*keep)(GemmPath)) const {
    const Timed* b = nullptr;
    for (const Timed& t : forced)
      if (keep(t.decision.path) && (!b || t.us < b->us)) b = &t;
    return b;
  }
  static bool engine(GemmPath p) {
    return p == GemmPath::kWarpSplitK || p == GemmPath::kWgmma || p == GemmPath::kWgmmaWide;
  }
  static bool warp(GemmPath p) { return p == GemmPath::kWarpSplitK; }
  static bool wgmma(GemmPath p) { return p == GemmPath::kWgmma; }
  static bool wide(GemmPath p) { return p == GemmPath::kWgmmaWide; }
  static bool cublas(GemmPath p) { return p == GemmPath::kCublas; }
  static bool lt(GemmPath p) { return p == GemmPath::kCublasLt; }
  static bool any(GemmPath) { return true; }
  // ours / the fastest path forced: the best engine tactic, cuBLAS or cuBLASLt (the
  // target's reference); NaN where no forced path ran (no reference).
  double vs_best() const {
    const double b = best(any);
    return std::isfinite(b) ? ours_us / b : std::numeric_limits<double>::quiet_NaN();
  }
};

std::string us_or_dash(double us) { return std::isfinite(us) ? fmt::format("{:.2f}", us) : "-"; }
double tbps(double bytes, double us) { return bytes / (us * 1e6); }

std::vector<GemmShape> shapes_of(const Options& o) {
  std::vector<GemmShape> s;
  for (const std::string& set : o.sets) {
    std::vector<GemmShape> add;
    if (set == "tp8" || set == "tp4" || set == "tp2" || set == "tp1")
      add = drafter_shapes(std::stoi(set.substr(2)));
    else if (set == "mid")
      add = mid_shapes();
    else
      check(set == "none", "bench gemm: --set {} (tp8, tp4, tp2, tp1, mid, none)", set);
    s.insert(s.end(), add.begin(), add.end());
  }
  for (const std::string& t : o.shapes) s.push_back(parse_shape(t));
  check(!s.empty(), "bench gemm: no shapes (--set none without --shape)");
  return s;
}

// Times every M of one shape: the dispatch and every candidate forced, each over the
// same rotating copies. Each is captured first, then all are timed interleaved (one
// replay of each in turn, medians): timed one after another, the dispatch measured
// up to 9 % off its own tactic forced moments later (a drift of the GPU's speed
// between the two figures, not a difference of what ran).
void bench_shape(const GemmShape& s, const Options& o, const Gpu& gpu, cudaStream_t stream, std::vector<Row>& rows) {
  const std::size_t bytes = static_cast<std::size_t>(s.bytes());
  const int copies = weight_copies(bytes, gpu.l2);
  const int calls = rotation_calls(copies, 10);
  DeviceBuffer pool(bytes * static_cast<std::size_t>(copies));  // [copies, N, K] bf16
  fill_uniform_bf16(pool.get(), static_cast<int64_t>(bytes / 2) * copies, 42, 1.0f, stream);
  auto cublas = std::make_shared<CublasContext>();
  // One dispatching, one forced (and one batch-invariant) DecodeGemm per copy, on one
  // context and the process's tuner.
  std::vector<std::unique_ptr<DecodeGemm>> ours, forced, invariant;
  for (int c = 0; c < copies; ++c) {
    const TensorView w = TensorView::bf16(pool.as<char>() + bytes * static_cast<std::size_t>(c), s.n, s.k);
    ours.push_back(std::make_unique<DecodeGemm>(w, cublas));
    forced.push_back(std::make_unique<DecodeGemm>(w, cublas));
    if (o.compare_invariant && ours.back()->engine_eligible()) {
      invariant.push_back(std::make_unique<DecodeGemm>(w, cublas));
      invariant.back()->set_batch_invariant(true, o.invariant_rows);
    }
  }
  const int max_m = *std::max_element(o.ms.begin(), o.ms.end());
  DeviceBuffer x(static_cast<std::size_t>(max_m * s.k) * 2);  // [max_m, K] bf16
  DeviceBuffer out(static_cast<std::size_t>(max_m * s.n) * 2);  // [max_m, N] bf16
  fill_uniform_bf16(x.get(), max_m * s.k, 7, 1.0f, stream);
  const double read_us = bench::time_streaming_read(pool.get(), bytes, copies, calls, o.replays, stream);
  for (int m : o.ms) {
    const TensorView xv = TensorView::bf16(x.get(), m, s.k);
    const TensorView ov = TensorView::bf16(out.get(), m, s.n);
    std::vector<std::unique_ptr<TimedGraph>> graphs;  // what is timed, in turn
    // The index of the graph of `gemms`' calls as they are now decided.
    auto capture = [&](std::vector<std::unique_ptr<DecodeGemm>>& gemms) {
      graphs.push_back(std::make_unique<TimedGraph>(
          stream, [&](cudaStream_t st, int c) { gemms[c % copies]->run(xv, ov, st); }, calls));
      return graphs.size() - 1;
    };
    Row r;
    r.shape = s;
    r.m = m;
    r.read_us = read_us;
    for (auto& g : ours) g->prepare(m, stream);  // the first tunes; the others find its decision
    if (ours[0]->prepared(m)) {
      r.chosen = ours[0]->decision(m);
      r.chosen_tactic = tactic_of(r.chosen, s.n, s.k, m);
    } else {
      r.chosen_tactic = "cublas default (no engine takes this row)";
    }
    const std::size_t ours_graph = capture(ours);
    std::optional<std::size_t> invariant_graph;
    if (!invariant.empty() && m <= kGemmMaxRows) {
      invariant_graph = capture(invariant);
      r.invariant_tactic = tactic_of(invariant[0]->decision(m), s.n, s.k, m);
      r.invariant_tuned_us = invariant[0]->decision(m).measured_us;
    }
    std::vector<GemmDecision> candidates;
    if (forced[0]->engine_eligible() && m <= kGemmMaxRows) candidates = forced[0]->candidates(m);
    std::vector<std::optional<std::size_t>> forced_graph;  // per candidate; none: it did not run
    for (const GemmDecision& d : candidates) {
      forced_graph.emplace_back();
      try {
        for (auto& g : forced) g->force(m, d);
        forced_graph.back() = capture(forced);
        graphs.back()->launch(stream);  // a candidate that fails to run fails here
        TPD_CUDA(cudaStreamSynchronize(stream));
      } catch (const Error& e) {
        fmt::print(stderr, "  {} at M {}: {} did not run: {}\n", s.name, m, tactic_of(d, s.n, s.k, m), e.what());
        cudaGetLastError();
        if (forced_graph.back()) graphs.pop_back();
        forced_graph.back().reset();
      }
    }
    for (int warm = 0; warm < 3; ++warm)
      for (const auto& g : graphs) g->launch(stream);
    interleave(graphs.size(), o.replays, [&](std::size_t i) { return graphs[i]->time_replay(stream); });
    auto median_of = [&](std::size_t i) { return graphs[i]->timing().median_us; };
    r.ours_us = median_of(ours_graph);
    if (invariant_graph) r.invariant_us = median_of(*invariant_graph);
    for (std::size_t c = 0; c < candidates.size(); ++c)
      r.forced.push_back({candidates[c], tactic_of(candidates[c], s.n, s.k, m),
                          forced_graph[c] ? median_of(*forced_graph[c]) : std::numeric_limits<double>::infinity()});
    if (candidates.empty()) r.forced.push_back({cublas_decision(), "cublas default", r.ours_us});
    rows.push_back(std::move(r));
  }
}

void print_table(const std::vector<Row>& rows, const bench::ReadCeiling& ceiling) {
  fmt::print("\n{:<6} {:<12} {:>6} {:>5} {:>7} {:>3} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6} {:>5} {:>5} {:>5} {:>6}  {}\n",
             "set", "linear", "N", "K", "MB", "M", "ours us", "wgmma", "wide", "warp", "cuBLAS", "cuBLASLt", "vsBest", "TB/s",
             "%ceil", "%read", "tuneMs", "dispatch -> best engine tactic");
  int flagged = 0;
  for (const Row& r : rows) {
    const double b = r.shape.bytes();
    const Timed* eng = r.best_timed(Row::engine);
    const bool slow = r.vs_best() > kDispatchSlack;
    flagged += slow;
    fmt::print("{:<6} {:<12} {:>6} {:>5} {:>7.1f} {:>3} {:>8.2f} {:>8} {:>8} {:>8} {:>8} {:>8} {:>5.3f}{} {:>5.2f} "
               "{:>4.0f}% {:>4.0f}% {:>6.1f}  {} -> {}\n",
               r.shape.set, r.shape.name, r.shape.n, r.shape.k, b / 1e6, r.m, r.ours_us, us_or_dash(r.best(Row::wgmma)),
               us_or_dash(r.best(Row::wide)), us_or_dash(r.best(Row::warp)), us_or_dash(r.best(Row::cublas)), us_or_dash(r.best(Row::lt)), r.vs_best(), slow ? "!" : " ",
               tbps(b, r.ours_us), 100.0 * tbps(b, r.ours_us) / ceiling.tb_per_s, 100.0 * r.read_us / r.ours_us,
               r.chosen.tune_ms, r.chosen_tactic, eng ? eng->tactic : "-");
  }
  fmt::print(
      "\nours = DecodeGemm's dispatch (the tuner's decision, PDL on); wgmma, wide, warp = the fastest tactic of each "
      "engine (wide: the wgmma engine's wide form) forced; cuBLAS = cublasGemmEx's default; cuBLASLt = the best of its heuristic's top algorithms; vsBest = ours / "
      "the fastest of them, '!' above {:.2f} ({} rows); TB/s counts "
      "weight bytes once per call; %read = a plain streaming read of the same copies / ours; tuneMs = what deciding "
      "cost (0: from the cache). Read ceiling {:.2f} TB/s ({:.1f} GB streamed in {:.1f} us).\n",
      kDispatchSlack, flagged, ceiling.tb_per_s, ceiling.bytes / 1e9, ceiling.median_us);

  // The DecodeGemm targets (docs/performance.md, "Targets"), over the rows above.
  const Row* worst = nullptr;
  int unreferenced = 0;
  for (const Row& r : rows) {
    if (std::isnan(r.vs_best())) {
      ++unreferenced;
      continue;
    }
    if (!worst || r.vs_best() > worst->vs_best()) worst = &r;
  }
  if (worst)
    fmt::print("target dispatch <= {:.2f} x the fastest path forced: {} of {} rows above; worst {:.3f} ({} {}x{} M {})"
               "{}\n",
               kDispatchSlack, flagged, rows.size() - unreferenced, worst->vs_best(), worst->shape.name, worst->shape.n,
               worst->shape.k, worst->m,
               unreferenced ? fmt::format("; {} rows not measured (no forced path ran)", unreferenced) : "");
  auto ceiling_target = [&](const char* what, double percent, bool (*in)(const Row&)) {
    const Row* low = nullptr;
    int below = 0, count = 0;
    for (const Row& r : rows) {
      if (!in(r)) continue;
      const double p = 100.0 * tbps(r.shape.bytes(), r.ours_us) / ceiling.tb_per_s;
      ++count;
      below += p < percent;
      if (!low || r.ours_us / r.shape.bytes() > low->ours_us / low->shape.bytes()) low = &r;
    }
    if (low)
      fmt::print("target {} >= {:.0f} % of the ceiling: {} of {} rows below; lowest {:.1f} % ({} {}x{} M {})\n", what,
                 percent, below, count, 100.0 * tbps(low->shape.bytes(), low->ours_us) / ceiling.tb_per_s,
                 low->shape.name, low->shape.n, low->shape.k, low->m);
  };
  // %read targets (a plain read of the same copies / ours).
  auto read_target = [&](const char* what, double percent, bool (*in)(const Row&)) {
    const Row* low = nullptr;
    int below = 0, count = 0;
    for (const Row& r : rows) {
      if (!in(r)) continue;
      ++count;
      below += 100.0 * r.read_us / r.ours_us < percent;
      if (!low || r.read_us / r.ours_us < low->read_us / low->ours_us) low = &r;
    }
    if (low)
      fmt::print("target {} >= {:.0f} % of a plain read: {} of {} rows below; lowest {:.1f} % ({} {}x{} M {})\n", what,
                 percent, below, count, 100.0 * low->read_us / low->ours_us, low->shape.name, low->shape.n, low->shape.k,
                 low->m);
  };
  // Why: a decision the tuner timed faster than it runs here is where the dispatch
  // misses the fastest path (the tuner's context differs from this run's, or noise).
  constexpr double kTunedSlack = 1.03;
  const Row* off = nullptr;
  int offs = 0;
  auto off_by = [](const Row& r) { return r.ours_us / r.chosen.measured_us; };
  for (const Row& r : rows) {
    if (r.chosen.measured_us <= 0) continue;
    if (off_by(r) > kTunedSlack || off_by(r) < 1 / kTunedSlack) ++offs;
    if (!off || std::abs(std::log(off_by(r))) > std::abs(std::log(off_by(*off)))) off = &r;
  }
  if (off)
    fmt::print("the tuner's median of its decision against ours here: {} rows beyond {:.0f} %; widest {:.3f} ({} {}x{} M "
               "{}: tuned {:.2f} us)\n",
               offs, 100 * (kTunedSlack - 1), off_by(*off), off->shape.name, off->shape.n, off->shape.k, off->m,
               off->chosen.measured_us);
  ceiling_target("weights >= 64 MB at M <= 16", 92, [](const Row& r) { return r.shape.bytes() >= 64e6 && r.m <= 16; });
  read_target("weights >= 32 MB at M <= 16", 92, [](const Row& r) { return r.shape.bytes() >= 32e6 && r.m <= 16; });
  read_target("weights >= 32 MB at M <= 64", 90, [](const Row& r) { return r.shape.bytes() >= 32e6; });
  read_target("weights 7-32 MB at M <= 64", 85,
              [](const Row& r) { return r.shape.bytes() >= 7e6 && r.shape.bytes() < 32e6; });
}

// The batch-invariant decision against the default dispatch (target: at most 1.05 x
// at M <= 8, docs/performance.md "Targets").
void print_invariant(const std::vector<Row>& rows) {
  constexpr double kTarget = 1.05;
  int count = 0, above = 0;
  double worst = 0;
  for (const Row& r : rows) {
    if (!r.invariant_us) continue;
    if (count++ == 0)
      fmt::print("\nBatch-invariant mode: µs of the default dispatch and of the invariant decision\n{:<6} {:<12} {:>3} "
                 "{:>8} {:>9} {:>6} {:>7}  {}\n",
                 "set", "linear", "M", "default", "invariant", "ratio", "tuned", "invariant decision");
    const double ratio = *r.invariant_us / r.ours_us;
    if (r.m <= 8) {
      above += ratio > kTarget;
      worst = std::max(worst, ratio);
    }
    const std::string tuned = r.invariant_tuned_us > 0 ? fmt::format("{:.2f}", r.invariant_tuned_us) : "-";
    fmt::print("{:<6} {:<12} {:>3} {:>8.2f} {:>9.2f} {:>6.3f} {:>7}  {}\n", r.shape.set, r.shape.name, r.m, r.ours_us,
               *r.invariant_us, ratio, tuned, r.invariant_tactic);
  }
  if (count == 0) return;
  int measured = 0;
  for (const Row& r : rows) measured += r.invariant_us && r.m <= 8;
  if (measured == 0)
    fmt::print("target invariant <= {:.2f} x the default at M <= 8: not measured (no row of M <= 8)\n", kTarget);
  else
    fmt::print("target invariant <= {:.2f} x the default at M <= 8: {} of {} rows above; worst {:.3f}\n", kTarget,
               above, measured, worst);
}

void write_json(const std::string& path, const std::vector<Row>& rows, const bench::ReadCeiling& ceiling,
                const Gpu& gpu, const Options& o) {
  nlohmann::json j;
  j["device"] = {{"name", gpu.name}, {"sms", gpu.sms}, {"l2_bytes", gpu.l2}};
  j["read_ceiling"] = {{"tb_per_s", ceiling.tb_per_s}, {"bytes", ceiling.bytes}, {"median_us", ceiling.median_us}};
  j["replays"] = o.replays;
  j["rows"] = nlohmann::json::array();
  // A path that did not run has no time (null), not 0 us.
  auto finite = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); };
  for (const Row& r : rows) {
    const double b = r.shape.bytes();
    nlohmann::json forced = nlohmann::json::array();
    for (const Timed& t : r.forced)
      forced.push_back({{"path", gemm_path_name(t.decision.path)}, {"tactic", t.tactic}, {"us", finite(t.us)}});
    j["rows"].push_back({{"set", r.shape.set},
                         {"linear", r.shape.name},
                         {"n", r.shape.n},
                         {"k", r.shape.k},
                         {"m", r.m},
                         {"path", gemm_path_name(r.chosen.path)},
                         {"source", gemm_source_name(r.chosen.source)},
                         {"tactic", r.chosen_tactic},
                         {"tune_ms", r.chosen.tune_ms},
                         {"tuned_us", r.chosen.measured_us},
                         {"tune_finalists", r.chosen.tune_finalists},
                         {"tune_rounds", r.chosen.tune_rounds},
                         {"tune_stable", r.chosen.tune_stable},
                         {"ours_us", r.ours_us},
                         {"best_engine_us", finite(r.best(Row::engine))},
                         {"best_wgmma_us", finite(r.best(Row::wgmma))},
                         {"best_wgmma_wide_us", finite(r.best(Row::wide))},
                         {"best_warp_us", finite(r.best(Row::warp))},
                         {"cublas_us", finite(r.best(Row::cublas))},
                         {"best_cublaslt_us", finite(r.best(Row::lt))},
                         {"best_any_us", finite(r.best(Row::any))},
                         {"vs_best", r.vs_best()},
                         {"read_us", r.read_us},
                         {"ours_tb_per_s", tbps(b, r.ours_us)},
                         {"percent_of_ceiling", 100.0 * tbps(b, r.ours_us) / ceiling.tb_per_s},
                         {"forced", forced}});
    if (r.invariant_us) {
      j["rows"].back()["invariant_us"] = *r.invariant_us;
      j["rows"].back()["invariant_tactic"] = r.invariant_tactic;
      j["rows"].back()["invariant_tuned_us"] = r.invariant_tuned_us;
    }
  }
  write_json_file(path, j);
}

void run(Options o) {
  // Every option checked before the GPU: a bad one is refused at once, not after a run.
  o.sets = unique_in_order(o.sets);
  o.ms = unique_in_order(o.ms);
  const std::vector<GemmShape> shapes = shapes_of(o);
  for (int m : o.ms) check(m >= 1 && m <= kGemmMaxRows, "bench gemm: --m {} (1 .. {})", m, kGemmMaxRows);
  const Gpu gpu = require_gpu("bench gemm");
  cudaStream_t stream;
  TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  fmt::print(stderr, "bench gemm: {} ({} SMs, L2 {} MB); measuring the read ceiling\n", gpu.name, gpu.sms,
             gpu.l2 >> 20);
  const bench::ReadCeiling ceiling = bench::measure_read_ceiling(std::size_t{4} << 30, 20, stream);
  std::vector<Row> rows;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    fmt::print(stderr, "[{}/{}] {} {} {}x{}\n", i + 1, shapes.size(), shapes[i].set, shapes[i].name, shapes[i].n,
               shapes[i].k);
    bench_shape(shapes[i], o, gpu, stream, rows);
  }
  TPD_CUDA(cudaStreamDestroy(stream));
  print_table(rows, ceiling);
  print_invariant(rows);
  if (!o.json.empty()) write_json(o.json, rows, ceiling, gpu, o);
}

}  // namespace

void register_bench_gemm(CLI::App& app) {
  CLI::App* cmd =
      bench_group(app)->add_subcommand("gemm", "DecodeGemm's dispatch vs every engine tactic and cuBLAS, per M");
  auto o = std::make_shared<Options>();
  cmd->add_option("--set", o->sets, "shape sets: tp8 tp4 tp2 tp1 mid none (repeatable; default tp8 tp1 mid)");
  cmd->add_option("--shape", o->shapes, "extra shape NxK (repeatable)");
  cmd->add_flag("--compare-invariant", o->compare_invariant,
                "also time the batch-invariant decision (DecodeGemm::set_batch_invariant) against the dispatch");
  cmd->add_option("--invariant-rows", o->invariant_rows, "the batch-invariant decision's row hint")
      ->check(CLI::Range(1, kGemmMaxRows))
      ->capture_default_str();
  cmd->add_option("--m", o->ms, "rows per call (repeatable; default 1 2 4 8 16 32 48 64)");
  cmd->add_option("--replays", o->replays, "timed graph replays per measurement")
      ->capture_default_str()
      ->check(positive_count());
  cmd->add_option("--json", o->json, "also write the rows as JSON to this file")->check(writable_file());
  cmd->callback([o] { run(*o); });
}

}  // namespace tpdecode::cli
