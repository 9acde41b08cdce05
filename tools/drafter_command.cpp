// tpdecode drafter: the main job. Builds the synthetic K3-DSpark-shaped drafter
// (docs/drafter.md) on the visible GPUs and runs its decode step on the stock
// path (cuBLAS + stock collectives + separate norms) and the specialised path
// (DecodeGemm + DrafterComm + PDL): per-step time, breakdown, token agreement,
// bitwise repeatability, the specialised step against its floor (weight bytes / the
// read ceiling measured in the same run). Several GPUs: an NCCL team at that TP (one
// thread per GPU). One GPU: a real TP 1 run and a local-team TP 8 run (8 ranks' work
// on one GPU: it measures the protocol, not NVLink). No GPU: the CPU reference step
// of a reduced configuration, with its math checked (no floor: nothing measured).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/check.hpp"
#include "drafter/cpu_checks.hpp"
#include "drafter/gpu_drafter.hpp"
#include "drafter/step.hpp"
#include "drafter_run.hpp"
#include "json_file.hpp"
#include "read_ceiling.hpp"
#include "tpdecode/device_info.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/local_team.hpp"
#include "tpdecode/nccl_team.hpp"

namespace tpdecode::cli {
namespace {

constexpr int kRowsCap = 64;  // rows one step takes (the drafter's buffers)

struct Options {
  std::vector<int> rows;  // default 1 7 14 28 56
  int requests = 0;
  int k = 7;
  int layers = 5;
  int replays = 30;
  std::vector<int> local_tp;  // one GPU: team sizes to run (default 1 and 8)
  std::string oproj = "auto";
  std::string json;
  CLI::Option* replays_option = nullptr;  // given on the command line (refused without a GPU)
  CLI::Option* local_tp_option = nullptr;
  CLI::Option* oproj_option = nullptr;
  CLI::Option* k_option = nullptr;  // only with --requests
};

// The row counts to run: --rows, plus requests · k. Refuses what a step cannot take
// before anything is built (no GPU needed to hear it).
std::vector<int> row_counts(const Options& o, std::vector<int> defaults) {
  require(o.k_option->count() == 0 || o.requests > 0,
          "drafter: --k is the draft tokens of each of --requests; give --requests too (or the rows with --rows)");
  std::vector<int> rows = o.rows.empty() ? std::move(defaults) : o.rows;
  if (o.requests > 0) {
    const long m = static_cast<long>(o.requests) * o.k;
    require(m <= kRowsCap, fmt::format("drafter: --requests {} x --k {} = {} rows; a step takes at most {} rows",
                                       o.requests, o.k, m, kRowsCap));
    rows.push_back(static_cast<int>(m));
  }
  for (int m : rows) require(m >= 1 && m <= kRowsCap, fmt::format("drafter: --rows {} outside 1 ... {}", m, kRowsCap));
  return unique_in_order(rows);
}

struct TeamRun {
  std::string team;  // e.g. "local TP 8 on one GPU"
  int tp = 0;
  std::string comm;  // which collectives the specialised path has
  std::vector<DrafterRow> rows;
  bool ranks_identical = true;  // NCCL team: every rank's logits hash equal, per row
  int64_t weight_bytes = 0;     // one rank's weights read per step (count_step_ops)
  int ranks_per_gpu = 1;        // the local team: every rank on GPU 0
  std::string error;            // why the run stopped ("" where it ran to the end)
};

// The step's floor: the weights one GPU streams per step (a rank's, times the ranks
// sharing it) at the read ceiling measured in this run.
double floor_us(const TeamRun& t, const bench::ReadCeiling& ceiling) {
  return static_cast<double>(t.weight_bytes) * t.ranks_per_gpu / (ceiling.tb_per_s * 1e6);
}

// Once per run, on GPU 0 (every team has a rank there), before the weights take its memory.
bench::ReadCeiling measure_ceiling() {
  fmt::print(stderr, "drafter: measuring the read ceiling on GPU 0\n");
  TPD_CUDA(cudaSetDevice(0));
  cudaStream_t stream;
  TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const bench::ReadCeiling c = bench::measure_read_ceiling(std::size_t{4} << 30, 20, stream);
  TPD_CUDA(cudaStreamDestroy(stream));
  return c;
}

// What a run without a GPU refuses (before it says it runs the CPU step instead).
void refuse_gpu_options(const Options& o) {
  for (const auto* opt : {o.replays_option, o.local_tp_option})
    require(opt->count() == 0, fmt::format("drafter: {} needs a GPU (this machine has none)", opt->get_name()));
  require(o.oproj == "auto", "drafter: --oproj " + o.oproj + " needs a GPU (this machine has none)");
}

// No GPU: the CPU reference step of the reduced configuration at each row count,
// with its checks; --json gets the checks.
bool run_cpu(const Options& o) {
  drafter::DrafterConfig c = drafter::DrafterConfig::reduced_cpu();
  c.layers = o.layers;
  nlohmann::json j{{"device", "cpu"}, {"config", c.describe()}, {"rows", nlohmann::json::array()}};
  bool all = true;
  for (int rows : row_counts(o, {o.k})) {
    fmt::print("tpdecode drafter: CPU reference step of a reduced configuration ({}), {} rows\n", c.describe(), rows);
    nlohmann::json checks = nlohmann::json::array();
    for (const drafter::CheckResult& r : drafter::check_cpu_reference(c, rows)) {
      fmt::print("  {:<16} {}  {}\n", r.name, r.pass ? "ok  " : "FAIL", r.detail);
      checks.push_back({{"name", r.name}, {"pass", r.pass}, {"detail", r.detail}});
      all &= r.pass;
    }
    j["rows"].push_back({{"m", rows}, {"checks", checks}});
  }
  fmt::print("{}\n", all ? "all checks hold" : "SOME CHECKS FAILED");
  if (!o.json.empty()) write_json_file(o.json, j);
  return all;
}

std::string ratio(double stock, double ours) { return ours > 0 ? fmt::format("{:.2f}x", stock / ours) : "-"; }

void print_run(const TeamRun& t, const bench::ReadCeiling& ceiling) {
  const double floor = floor_us(t, ceiling);
  fmt::print("\n{} (specialised path's collectives: {})\n", t.team, t.comm);
  fmt::print("floor {:.1f} us: {}{:.1f} MB of weights per rank / {:.2f} TB/s\n", floor,
             t.ranks_per_gpu > 1 ? fmt::format("{} ranks x ", t.ranks_per_gpu) : "", t.weight_bytes / 1e6,
             ceiling.tb_per_s);
  fmt::print("{:>4} {:>10} {:>10} {:>6} {:>9} {:>10} | {:>23} | {:>23} | {:>9} {:>9} {:>8} {:>6} {:>7}\n", "M",
             "stock us", "spec us", "ratio", "floor us", "step/floor", "stock gemm/coll/other", "spec gemm/coll/other",
             "tokens", "near-tie", "max|dL|", "bitwise", "non-fin");
  for (const DrafterRow& r : t.rows) {
    const auto parts = [](const PathTimes& p) {
      return fmt::format("{:.0f}/{:.0f}/{:.0f}", p.gemm_us, p.collective_us, p.other_us);
    };
    fmt::print(
        "{:>4} {:>10.1f} {:>10.1f} {:>6} {:>9.1f} {:>10.2f} | {:>23} | {:>23} | {:>4}/{:<4} {:>9} {:>8.4f} "
        "{:>6} {:>7}\n",
        r.m, r.stock.step_us, r.specialised.step_us, ratio(r.stock.step_us, r.specialised.step_us), floor,
        r.specialised.step_us / floor, parts(r.stock), parts(r.specialised), r.m - r.token_disagreements, r.m,
        fmt::format("{}/{}", r.disagreements_near_tie, r.token_disagreements), r.max_logit_diff,
        r.repeat_bitwise && r.ranks_identical ? "yes" : "NO", r.non_finite_logits);
  }
  if (t.rows.empty() || t.rows.front().program.step_us <= 0) return;
  fmt::print("the program path (form programs: the step's GEMMs, norms, residual adds, all-reduce + norms and "
             "SiLU-muls as programs, one per rank, the rest as the specialised path's kernels; launches: above {} "
             "rows, the specialised path's kernels):\n",
             drafter::GpuDrafter::kProgramMaxRows);
  fmt::print("{:>4} {:>9} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>6}\n", "M", "form", "prog us", "step/floor",
             "stock/prog", "spec/prog", "tokens", "near-tie", "bitwise");
  for (const DrafterRow& r : t.rows)
    fmt::print("{:>4} {:>9} {:>10.1f} {:>10.2f} {:>10} {:>10} {:>4}/{:<4} {:>9} {:>6}\n", r.m, r.program.form,
               r.program.step_us,
               r.program.step_us / floor, ratio(r.stock.step_us, r.program.step_us),
               ratio(r.specialised.step_us, r.program.step_us), r.m - r.program.token_disagreements, r.m,
               fmt::format("{}/{}", r.program.disagreements_near_tie, r.program.token_disagreements),
               r.program.repeat_bitwise ? "yes" : "NO");
}

nlohmann::json to_json(const PathTimes& p) {
  return {{"step_us", p.step_us}, {"gemm_us", p.gemm_us}, {"collective_us", p.collective_us}, {"other_us", p.other_us}};
}

void write_json(const std::string& path, const std::vector<TeamRun>& runs, const drafter::DrafterConfig& c,
                const std::string& device, const bench::ReadCeiling& ceiling) {
  nlohmann::json j;
  j["device"] = device;
  j["config"] = c.describe();
  j["near_tie_ulps"] = kNearTieUlps;
  j["read_ceiling"] = {{"tb_per_s", ceiling.tb_per_s}, {"bytes", ceiling.bytes}, {"median_us", ceiling.median_us}};
  for (const TeamRun& t : runs) {
    nlohmann::json jt{{"team", t.team},
                      {"tp", t.tp},
                      {"collectives", t.comm},
                      {"weight_bytes_per_rank", t.weight_bytes},
                      {"ranks_per_gpu", t.ranks_per_gpu},
                      {"rows", nlohmann::json::array()}};
    if (!t.error.empty()) jt["error"] = t.error;
    const double floor = floor_us(t, ceiling);
    for (const DrafterRow& r : t.rows) {
      jt["rows"].push_back(
          {{"m", r.m},
           {"stock", to_json(r.stock)},
           {"specialised", to_json(r.specialised)},
           {"ratio", r.stock.step_us / r.specialised.step_us},
           {"floor_us", floor},
           {"step_over_floor", r.specialised.step_us / floor},
           {"read_ceiling_tb_per_s", ceiling.tb_per_s},
           {"token_disagreements", r.token_disagreements},
           {"disagreements_near_tie", r.disagreements_near_tie},
           {"max_logit_diff", std::isnan(r.max_logit_diff) ? nlohmann::json() : nlohmann::json(r.max_logit_diff)},
           {"non_finite_logits", r.non_finite_logits},
           {"repeat_bitwise", r.repeat_bitwise},
           {"ranks_identical", r.ranks_identical}});
      if (r.program.step_us > 0)
        jt["rows"].back()["program"] = {{"form", r.program.form},
                                        {"step_us", r.program.step_us},
                                        {"step_over_floor", r.program.step_us / floor},
                                        {"token_disagreements", r.program.token_disagreements},
                                        {"disagreements_near_tie", r.program.disagreements_near_tie},
                                        {"repeat_bitwise", r.program.repeat_bitwise}};
    }
    j["runs"].push_back(jt);
  }
  write_json_file(path, j);
}

void run(const Options& o) {
  DrafterRunOptions ro;
  ro.rows = row_counts(o, {1, 7, 14, 28, 56});
  ro.replays = o.replays;
  for (OprojKind k : {OprojKind::kUnfused, OprojKind::kProducerConsumer, OprojKind::kFused})
    if (o.oproj == oproj_kind_name(k)) ro.oproj = k;
  const std::vector<int> local_tp = unique_in_order(o.local_tp);
  for (int tp : local_tp)
    require(supported_team_size(tp), fmt::format("drafter: --local-tp {} (1, 2, 4, 8 or 16)", tp));
  std::string why;
  const int gpus = visible_gpu_count(&why);
  if (gpus == 0) {
    refuse_gpu_options(o);
    fmt::print("tpdecode drafter: no GPU visible ({}); running the CPU reference step instead.\n", why);
    if (!run_cpu(o)) throw Error("drafter: CPU reference checks failed");
    return;
  }
  require(o.local_tp_option->count() == 0 || gpus == 1,
          fmt::format("drafter: --local-tp runs teams on one GPU; {} GPUs are visible (the NCCL team runs)", gpus));
  drafter::DrafterConfig config = drafter::DrafterConfig::reference();
  config.layers = o.layers;
  cudaDeviceProp prop{};
  TPD_CUDA(cudaGetDeviceProperties(&prop, 0));
  fmt::print("tpdecode drafter: {} ({}), {} GPU(s): {}\n", config.describe(), "synthetic K3-DSpark shapes", gpus,
             prop.name);
  fmt::print("per-step medians of CUDA-graph replays ({} replays of one step); breakdown: graphs of only the GEMMs,\n"
             "only the collectives, only the other kernels, each timed alone; tokens: rows whose draft tokens agree;\n"
             "near-tie: disagreements whose stock top-2 logits are within {} BF16 ulps; bitwise: specialised logits\n"
             "identical run to run and on every rank; floor: the weights one GPU streams per step (each GEMM shard\n"
             "and norm weight of a rank once; a local team's GPU streams every rank's) / the read ceiling measured in\n"
             "this run (next line), no collective time; step/floor: spec us / floor us\n",
             ro.replays, kNearTieUlps);
  const bench::ReadCeiling ceiling = measure_ceiling();
  fmt::print("read ceiling {:.2f} TB/s on GPU 0 ({:.1f} GB streamed in {:.1f} us)\n", ceiling.tb_per_s,
             ceiling.bytes / 1e9, ceiling.median_us);
  std::vector<TeamRun> runs;
  bool failed = false;
  if (gpus >= 2) {
    std::string nccl_why;
    if (!nccl_team_available(&nccl_why)) throw Unavailable("drafter: several GPUs but no NCCL team: " + nccl_why);
    int tp = 1;
    while (tp * 2 <= std::min(gpus, 8)) tp *= 2;
    std::vector<int> devices;
    for (int d = 0; d < tp; ++d) devices.push_back(d);
    TeamRun t{fmt::format("NCCL team, TP {} on {} GPUs", tp, tp), tp, "", {}, true};
    t.weight_bytes = drafter::count_step_ops(config, tp).weight_bytes;
    std::mutex mu;
    std::vector<std::vector<uint64_t>> hashes(static_cast<std::size_t>(tp));
    NcclTeam::run_threads(devices, [&](NcclTeam& team) {
      DrafterRunOptions mine = ro;
      mine.verbose = team.rank() == 0;
      std::string comm;
      std::vector<DrafterRow> rows;
      measure_drafter(team, config, mine, rows, &comm);
      std::lock_guard<std::mutex> lock(mu);
      for (const DrafterRow& r : rows) hashes[static_cast<std::size_t>(team.rank())].push_back(r.logits_hash);
      if (team.rank() == 0) t.rows = rows, t.comm = comm;
    });
    for (std::size_t i = 0; i < t.rows.size(); ++i) {
      bool same = true;
      for (const auto& h : hashes) same &= h.at(i) == hashes[0].at(i);
      t.rows[i].ranks_identical = same;
    }
    print_run(t, ceiling);
    runs.push_back(t);
  } else {
    for (int tp : local_tp.empty() ? std::vector<int>{1, 8} : local_tp) {
      TeamOptions options;
      options.pdl = tp == 1;  // ranks sharing a GPU: no PDL (apps/drafter/gpu_step_ops.cpp says why)
      TeamRun t{tp == 1 ? std::string("TP 1 on one GPU")
                        : fmt::format("local team TP {} on one GPU (protocol cost, not NVLink)", tp),
                tp, "", {}, true};
      t.weight_bytes = drafter::count_step_ops(config, tp).weight_bytes;
      t.ranks_per_gpu = tp;
      try {
        LocalTeam team(tp, 0, options);
        measure_drafter(team, config, ro, t.rows, &t.comm);
      } catch (const Error& e) {
        // Why go on: the other team size's results are still worth printing.
        fmt::print("{}: FAILED: {}\n", t.team, e.what());
        t.error = e.what();
        failed = true;
      }
      print_run(t, ceiling);
      runs.push_back(t);
    }
  }
  int non_finite = 0;
  for (const TeamRun& t : runs)
    for (const DrafterRow& r : t.rows) non_finite += r.non_finite_logits;
  if (!o.json.empty()) write_json(o.json, runs, config, prop.name, ceiling);
  if (failed) throw Error("drafter: a team run failed (see above)");
  check<Error>(non_finite == 0, "drafter: {} logits were NaN or infinite (the non-fin column)", non_finite);
}

}  // namespace

void register_drafter(CLI::App& app) {
  const auto add = [](CLI::App* cmd) {
    auto o = std::make_shared<Options>();  // one per subcommand: it keeps that subcommand's options
    cmd->add_option("--rows", o->rows, "rows per step M (repeatable; default 1 7 14 28 56)")->check(CLI::Range(1, 64));
    cmd->add_option("--requests", o->requests, "also run M = requests · k (at most 64 rows)")->check(CLI::Range(1, 64));
    o->k_option = cmd->add_option("--k", o->k, "draft tokens per request (with --requests)")
                      ->capture_default_str()
                      ->check(CLI::Range(1, 64));
    cmd->add_option("--layers", o->layers, "draft layers")->capture_default_str()->check(CLI::Range(1, 64));
    o->replays_option = cmd->add_option("--replays", o->replays, "timed graph replays per measurement (GPU)")
                            ->capture_default_str()
                            ->check(positive_count());
    o->local_tp_option =
        cmd->add_option("--local-tp", o->local_tp, "one GPU: local team sizes to run (repeatable; default 1 8)");
    o->oproj_option = cmd->add_option("--oproj", o->oproj,
                                      "the specialised path's o_proj + all-reduce + norm: auto (the measured rule "
                                      "table), unfused, producer-consumer or fused (GPU)")
                          ->capture_default_str()
                          ->check(CLI::IsMember({"auto", "unfused", "producer-consumer", "fused"}));
    cmd->add_option("--json", o->json, "also write the results as JSON to this file (with or without a GPU)")
        ->check(writable_file());
    cmd->callback([o] { run(*o); });
  };
  add(app.add_subcommand("drafter", "the main job: the drafter step, stock vs specialised (CPU reference without a GPU)"));
  add(bench_group(app)->add_subcommand("drafter", "the drafter step (same as `tpdecode drafter`)"));
}

}  // namespace tpdecode::cli
