// tpdecode bench comm: TpComm's collectives per op, TP, hidden size and row count,
// each path forced in turn (one-shot, two-shot, stock) and the path the automatic
// choice takes, with the automatic choice's time over the fastest path's; ar_norm's
// FP8 epilogues against its BF16 output on the same path; batch-invariant mode
// against the default; the crossover table's entries fitted to the run (--fit).
// CUDA-graph replays, median of many. The local team (one GPU playing TP ranks,
// each on its own stream, all launched inside one graph) measures protocol cost,
// not NVLink; the NCCL team runs one thread per GPU.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "comm/crossover_fit.hpp"
#include "commands.hpp"
#include "core/graph_timing.hpp"
#include "core/random_fill.hpp"
#include "core/streams.hpp"
#include "json_file.hpp"
#include "tpdecode/comm.hpp"
#include "tpdecode/device_buffer.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/local_team.hpp"
#include "tpdecode/nccl_team.hpp"

namespace tpdecode::cli {
namespace {

constexpr int kRowsCap = 64;
// ar_norm's FP8 variants are ops of their own: "ar_norm_" + the quant's name.
const std::vector<std::string> kOps = {"all_reduce",         "ar_norm",          "ar_norm_noresidual",
                                       "ar_norm_fp8-static", "ar_norm_fp8-group", "ar_norm_fp8-group-ue8m0",
                                       "gather_context",     "gather_logits"};
constexpr ArNormQuant kQuants[] = {ArNormQuant::kStatic, ArNormQuant::kGroup, ArNormQuant::kGroupUe8m0};

struct Options {
  std::string team = "local";
  std::vector<int> tp;  // empty: 8 on the local team, every visible GPU (at most 8) on the NCCL team
  std::vector<int64_t> hidden = {7168};
  std::vector<int> rows = {1, 2, 4, 8, 16, 32, 64};
  std::vector<std::string> ops = {"all_reduce", "ar_norm", "gather_context", "gather_logits"};
  int64_t vocab_shard = 20480;
  int replays = 200;
  int calls = 20;  // calls per graph
  bool system_fence = false;
  bool compare_invariant = false;
  bool fit = false;
  float eps = 1e-6f;  // ar_norm's
  std::string json;
};

// A path forced for the timing, and its column in the table.
struct Column {
  CommAlgorithm algorithm;
  CommPath path;
  const char* name;
};
const Column kColumns[] = {{CommAlgorithm::kOneShot, CommPath::kOneShot, "one-shot"},
                           {CommAlgorithm::kTwoShot, CommPath::kTwoShot, "two-shot"},
                           {CommAlgorithm::kStock, CommPath::kStock, "stock"}};

struct Cell {
  double us = 0;    // median per call, all ranks
  std::string why;  // not served: why (no time)
};

struct Row {
  std::string op;
  int tp = 0;
  int64_t hidden = 0;
  int rows = 0;
  std::map<std::string, Cell> cells;  // by column name
  std::string chosen;                 // the path the automatic choice takes
  std::optional<double> invariant_us;  // --compare-invariant: the automatic choice, batch-invariant
};

ArNormQuant quant_of(const std::string& op) {
  for (ArNormQuant q : kQuants)
    if (op == std::string("ar_norm_") + ar_norm_quant_name(q)) return q;
  return ArNormQuant::kNone;
}
bool is_ar_norm(const std::string& op) { return op.rfind("ar_norm", 0) == 0; }

// One driven rank's tensors of every op at kRowsCap rows (calls use the first rows).
struct RankTensors {
  DeviceBuffer x, residual, out, res_out, ctx_shard, ctx_out, logits_shard, logits_out, q, scales;
};

class Workload {
 public:
  Workload(Team& team, int64_t hidden, int64_t vocab_shard, float eps)
      : team_(team), hidden_(hidden), vocab_(vocab_shard), eps_(eps) {
    const int tp = team.size();
    const auto rows_h = static_cast<std::size_t>(kRowsCap * hidden * 2);
    TPD_CUDA(cudaSetDevice(team.device(0)));
    weight_ = filled(static_cast<std::size_t>(hidden * 2), 1);
    static_scale_ = DeviceBuffer(sizeof(float));
    const float scale = 0.01f;
    TPD_CUDA(cudaMemcpy(static_scale_.get(), &scale, sizeof scale, cudaMemcpyHostToDevice));
    for (int i = 0; i < team.driven(); ++i) {
      RankTensors t{filled(rows_h, 10 + i),
                    filled(rows_h, 100 + i),
                    DeviceBuffer(rows_h),
                    DeviceBuffer(rows_h),
                    filled(rows_h / tp, 200 + i),
                    DeviceBuffer(rows_h),
                    filled(static_cast<std::size_t>(kRowsCap * vocab_shard * 2), 300 + i),
                    DeviceBuffer(static_cast<std::size_t>(kRowsCap * vocab_shard * 2 * tp)),
                    DeviceBuffer(rows_h / 2),
                    DeviceBuffer(static_cast<std::size_t>(kRowsCap * hidden / kArNormQuantGroup * 4 + 16))};
      ranks_.push_back(std::move(t));
    }
    TPD_CUDA(cudaDeviceSynchronize());
  }

  // One call of `op` on every driven rank, on `streams`.
  CommResult enqueue(TpComm& comm, const std::string& op, int rows, const std::vector<cudaStream_t>& streams) const {
    if (op == "all_reduce") {
      std::vector<AllReduceIo> io;
      for (const RankTensors& t : ranks_) io.push_back(all_reduce_io(t, rows));
      return comm.all_reduce(io, streams);
    }
    if (is_ar_norm(op)) {
      std::vector<ArNormIo> io;
      for (const RankTensors& t : ranks_) io.push_back(ar_norm_io(t, rows, op));
      return comm.ar_norm(io, streams);
    }
    std::vector<GatherIo> io;
    for (const RankTensors& t : ranks_) io.push_back(gather_io(t, rows, op == "gather_logits"));
    return comm.gather(io, streams);
  }

  // The path of `op` under comm's algorithm (nothing launched).
  CommResult plan(const TpComm& comm, const std::string& op, int rows) const {
    const RankTensors& t = ranks_[0];
    if (op == "all_reduce") return comm.plan_all_reduce(all_reduce_io(t, rows));
    if (is_ar_norm(op)) return comm.plan_ar_norm(ar_norm_io(t, rows, op));
    return comm.plan_gather(gather_io(t, rows, op == "gather_logits"));
  }

 private:
  static DeviceBuffer filled(std::size_t bytes, uint64_t seed) {
    DeviceBuffer b(bytes);
    fill_uniform_bf16(b.get(), static_cast<int64_t>(bytes / 2), seed, 1.0f, nullptr);
    return b;
  }
  AllReduceIo all_reduce_io(const RankTensors& t, int rows) const {
    return {TensorView::bf16(t.x.get(), rows, hidden_), TensorView::bf16(t.out.get(), rows, hidden_)};
  }
  ArNormIo ar_norm_io(const RankTensors& t, int rows, const std::string& op) const {
    ArNormIo io;
    io.x = TensorView::bf16(t.x.get(), rows, hidden_);
    if (op != "ar_norm_noresidual") io.residual = TensorView::bf16(t.residual.get(), rows, hidden_);
    io.weight = TensorView::bf16(weight_.get(), 1, hidden_);
    io.eps = eps_;
    io.out = TensorView::bf16(t.out.get(), rows, hidden_);
    io.residual_out = TensorView::bf16(t.res_out.get(), rows, hidden_);
    io.quant = quant_of(op);
    if (io.quant != ArNormQuant::kNone) io.out = TensorView::e4m3(t.q.get(), rows, hidden_);
    if (io.quant == ArNormQuant::kStatic) io.scale = TensorView::f32(static_scale_.get(), 1, 1);
    if (io.quant == ArNormQuant::kGroup || io.quant == ArNormQuant::kGroupUe8m0)
      io.scale = TensorView::f32(t.scales.get(), rows, hidden_ / kArNormQuantGroup);
    return io;
  }
  GatherIo gather_io(const RankTensors& t, int rows, bool logits) const {
    const int64_t s = logits ? vocab_ : hidden_ / team_.size();
    return {TensorView::bf16(logits ? t.logits_shard.get() : t.ctx_shard.get(), rows, s),
            TensorView::bf16(logits ? t.logits_out.get() : t.ctx_out.get(), rows, s * team_.size())};
  }

  Team& team_;
  int64_t hidden_, vocab_;
  float eps_;
  DeviceBuffer weight_, static_scale_;
  std::vector<RankTensors> ranks_;
};

double time_op(TpComm& comm, const Workload& w, const std::string& op, int rows, const Options& o) {
  Team& team = comm.team();
  std::vector<cudaStream_t> streams;
  for (int i = 0; i < team.driven(); ++i) streams.push_back(team.stream(i));
  w.enqueue(comm, op, rows, streams);  // eager warm-up outside the capture
  team.synchronize();
  const GraphTiming t = time_graph(
      streams[0],
      [&](cudaStream_t origin, int) {
        fork_streams(origin, streams);
        w.enqueue(comm, op, rows, streams);
        join_streams(origin, streams);
      },
      o.calls, o.replays);
  team.synchronize();
  return t.median_us;
}

CommConfig config_for(const Team& team, int64_t hidden, const Options& o, bool invariant) {
  CommConfig cc;
  cc.hidden = hidden;
  cc.rows_cap = kRowsCap;
  cc.gather_row_bytes = std::max(hidden, o.vocab_shard * team.size()) * 2;
  cc.system_fence = o.system_fence;
  cc.batch_invariant = invariant;
  return cc;
}

// Every (hidden, op, rows) on one team object; rows appended when `record`.
void measure(Team& team, const Options& o, bool record, std::vector<Row>& out) {
  for (int64_t hidden : o.hidden) {
    TpComm comm(team, config_for(team, hidden, o, false));
    std::optional<TpComm> invariant;
    if (o.compare_invariant) invariant.emplace(team, config_for(team, hidden, o, true));
    Workload w(team, hidden, o.vocab_shard, o.eps);
    for (const std::string& op : o.ops) {
      if (quant_of(op) != ArNormQuant::kNone && quant_of(op) != ArNormQuant::kStatic &&
          !ar_norm_group_quant_served(hidden)) {
        if (record) fmt::print(stderr, "  {} at hidden {}: not served (multiples of 1024)\n", op, hidden);
        continue;
      }
      for (int rows : o.rows) {
        if (record) fmt::print(stderr, "  {} TP {} H {} rows {}\n", op, team.size(), hidden, rows);
        Row r{op, team.size(), hidden, rows, {}, {}, {}};
        for (const Column& c : kColumns) {
          comm.set_algorithm(c.algorithm);
          const CommResult plan = w.plan(comm, op, rows);
          Cell& cell = r.cells[c.name];
          if (plan.path == c.path)
            cell.us = time_op(comm, w, op, rows, o);
          else
            cell.why = plan.why.empty() ? fmt::format("runs {}", comm_path_name(plan.path)) : plan.why;
        }
        comm.set_algorithm(CommAlgorithm::kAuto);
        r.chosen = comm_path_name(w.plan(comm, op, rows).path);
        if (invariant) r.invariant_us = time_op(*invariant, w, op, rows, o);
        if (record) out.push_back(r);
      }
    }
  }
}

std::string cell_text(const Cell& c) { return c.why.empty() ? fmt::format("{:.2f}", c.us) : "-"; }

// a / b of two timed cells, "-" where either was not served.
std::string ratio_text(const Cell& a, const Cell& b) {
  return a.why.empty() && b.why.empty() && b.us > 0 ? fmt::format("{:.2f}", a.us / b.us) : "-";
}

// The automatic choice's time over the fastest served path's, marked past 3 %.
std::string auto_over_best(const Row& r) {
  const Cell& chosen = r.cells.at(r.chosen);
  double best = 0;
  for (const auto& [name, c] : r.cells)
    if (c.why.empty() && (best == 0 || c.us < best)) best = c.us;
  if (!chosen.why.empty() || best <= 0) return "-";
  const double ratio = chosen.us / best;
  return fmt::format("{:.2f}{}", ratio, ratio > 1.03 ? " !" : "");
}

void print_table(const std::vector<Row>& rows, const std::string& team) {
  fmt::print("{:<24} {:>3} {:>6} {:>5} {:>10} {:>10} {:>10} {:>9} {:>8} {:>6} {:>9}\n", "op", "TP", "H", "rows",
             "one-shot", "two-shot", "stock", "auto", "stock/x", "1s/2s", "auto/best");
  std::map<std::string, std::string> reasons;
  for (const Row& r : rows) {
    fmt::print("{:<24} {:>3} {:>6} {:>5} {:>10} {:>10} {:>10} {:>9} {:>8} {:>6} {:>9}\n", r.op, r.tp, r.hidden,
               r.rows, cell_text(r.cells.at("one-shot")), cell_text(r.cells.at("two-shot")),
               cell_text(r.cells.at("stock")), r.chosen, ratio_text(r.cells.at("stock"), r.cells.at(r.chosen)),
               ratio_text(r.cells.at("one-shot"), r.cells.at("two-shot")), auto_over_best(r));
    for (const auto& [name, c] : r.cells)
      if (!c.why.empty()) reasons.emplace(c.why, name);
  }
  fmt::print("\nµs per call (all ranks), inside a CUDA graph, median of replays; stock/x = stock / the automatic "
             "choice; 1s/2s = one-shot / two-shot; auto/best = the automatic choice / the fastest path (! past 3 %: "
             "refit src/comm/crossover.hpp with --fit).\n");
  for (const auto& [why, name] : reasons) fmt::print("  - {} not served: {}\n", name, why);
  if (team == "local")
    fmt::print("Local team: every rank on this one GPU; this measures protocol cost, not NVLink.\n");
}

// Each FP8 row's time over the BF16 ar_norm's of the same (TP, H, rows) on each path.
void print_fp8(const std::vector<Row>& rows) {
  std::map<std::tuple<int, int64_t, int>, const Row*> bf16;
  for (const Row& r : rows)
    if (r.op == "ar_norm") bf16[{r.tp, r.hidden, r.rows}] = &r;
  bool header = false;
  for (const Row& r : rows) {
    const auto base = bf16.find({r.tp, r.hidden, r.rows});
    if (quant_of(r.op) == ArNormQuant::kNone || base == bf16.end()) continue;
    if (!header) {
      fmt::print("\nFP8 epilogues: time / the BF16 ar_norm's on the same path (target <= 1.10)\n{:<24} {:>3} {:>6} "
                 "{:>5} {:>10} {:>10} {:>10}\n",
                 "op", "TP", "H", "rows", "one-shot", "two-shot", "stock");
      header = true;
    }
    fmt::print("{:<24} {:>3} {:>6} {:>5}", r.op, r.tp, r.hidden, r.rows);
    for (const Column& c : kColumns) fmt::print(" {:>10}", ratio_text(r.cells.at(c.name), base->second->cells.at(c.name)));
    fmt::print("\n");
  }
}

// The automatic choice batch-invariant over the default.
void print_invariant(const std::vector<Row>& rows) {
  bool header = false;
  for (const Row& r : rows) {
    if (!r.invariant_us) continue;
    if (!header) {
      fmt::print("\nBatch-invariant mode: the automatic choice's µs, default and invariant (target <= 1.05 at rows "
                 "<= 8)\n{:<24} {:>3} {:>6} {:>5} {:>10} {:>10} {:>6}\n",
                 "op", "TP", "H", "rows", "default", "invariant", "ratio");
      header = true;
    }
    const Cell& chosen = r.cells.at(r.chosen);
    fmt::print("{:<24} {:>3} {:>6} {:>5} {:>10} {:>10.2f} {:>6}\n", r.op, r.tp, r.hidden, r.rows, cell_text(chosen),
               *r.invariant_us, chosen.why.empty() ? fmt::format("{:.2f}", *r.invariant_us / chosen.us) : "-");
  }
}

std::vector<PathTimes> path_times(const std::vector<Row>& rows, const std::string& team) {
  std::vector<PathTimes> out;
  for (const Row& r : rows) {
    if (r.op != "all_reduce" && r.op != "ar_norm") continue;
    PathTimes m{r.tp, team == "local" ? CommTransport::kOneGpu : CommTransport::kNvlink, r.op == "ar_norm", r.hidden,
                r.rows, {}};
    for (const Column& c : kColumns)
      if (r.cells.at(c.name).why.empty()) m.us[static_cast<std::size_t>(c.path)] = r.cells.at(c.name).us;
    out.push_back(m);
  }
  return out;
}

void print_fit(const std::vector<Row>& rows, const std::string& team) {
  const std::vector<CrossoverEntry> entries = fit_crossover(path_times(rows, team));
  fmt::print("\nsrc/comm/crossover.hpp entries fitted to this run (the path within 1.5 % of the fastest, kept while "
             "it stays there):\n");
  for (const CrossoverEntry& e : entries) fmt::print("{}\n", crossover_entry_text(e));
}

void write_json(const std::string& path, const std::vector<Row>& rows, const Options& o, const std::string& device) {
  nlohmann::json j;
  j["team"] = o.team;
  j["device"] = device;
  j["replays"] = o.replays;
  j["calls_per_graph"] = o.calls;
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json jr{{"op", r.op}, {"tp", r.tp}, {"hidden", r.hidden}, {"rows", r.rows}, {"auto", r.chosen}};
    for (const auto& [name, c] : r.cells)
      jr[name] = c.why.empty() ? nlohmann::json{{"us", c.us}} : nlohmann::json{{"not_served", c.why}};
    if (r.invariant_us) jr["auto_batch_invariant_us"] = *r.invariant_us;
    j["rows"].push_back(jr);
  }
  write_json_file(path, j);
}

void run(const Options& o) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw Unavailable("bench comm needs a CUDA GPU; none is visible here");
  }
  cudaDeviceProp prop{};
  TPD_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::vector<Row> rows;
  if (o.team == "local") {
    for (int tp : o.tp.empty() ? std::vector<int>{8} : o.tp) {
      fmt::print(stderr, "bench comm: local team of {} ranks on {}\n", tp, prop.name);
      LocalTeam team(tp);
      measure(team, o, true, rows);
    }
  } else {
    std::string why;
    if (!nccl_team_available(&why)) throw Unavailable("bench comm --team nccl: " + why);
    if (count < 2)
      throw Unavailable(fmt::format("bench comm --team nccl needs at least 2 GPUs; {} visible. Use --team local", count));
    for (int tp : o.tp.empty() ? std::vector<int>{std::min(count, 8)} : o.tp) {
      require(tp <= count, fmt::format("bench comm: --tp {} but {} GPUs visible", tp, count));
      std::vector<int> devices;
      for (int d = 0; d < tp; ++d) devices.push_back(d);
      fmt::print(stderr, "bench comm: NCCL team of {} GPUs ({})\n", tp, prop.name);
      std::mutex m;
      NcclTeam::run_threads(devices, [&](NcclTeam& team) {
        std::vector<Row> mine;
        measure(team, o, team.rank() == 0, mine);
        std::lock_guard<std::mutex> lock(m);
        if (team.rank() == 0) rows.insert(rows.end(), mine.begin(), mine.end());
      });
    }
  }
  print_table(rows, o.team);
  print_fp8(rows);
  print_invariant(rows);
  if (o.fit) print_fit(rows, o.team);
  if (!o.json.empty()) write_json(o.json, rows, o, prop.name);
}

}  // namespace

void register_bench_comm(CLI::App& app) {
  CLI::App* cmd = bench_group(app)->add_subcommand("comm", "TpComm's collectives per path (one-shot, two-shot, stock)");
  auto o = std::make_shared<Options>();
  cmd->add_option("--team", o->team, "local (one GPU plays every rank) or nccl (one thread per GPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"local", "nccl"}));
  cmd->add_option("--tp", o->tp, "team sizes (repeatable; default: 8 local; visible GPUs, at most 8, nccl)")
      ->check(CLI::IsMember({2, 4, 8, 16}));
  cmd->add_option("--hidden", o->hidden, "hidden sizes (repeatable; multiples of 64 up to 16384)")
      ->check(CLI::Range(int64_t{64}, kArNormMaxHidden))
      ->check(CLI::Validator(
          [](std::string& text) {
            return std::stoll(text) % 64 == 0 ? std::string() : text + " is not a multiple of 64";
          },
          "MULTIPLE OF 64"));
  cmd->add_option("--rows", o->rows, "rows per call (repeatable; default 1 2 4 8 16 32 64)")->check(CLI::Range(1, kRowsCap));
  cmd->add_option("--op", o->ops,
                  "all_reduce, ar_norm, ar_norm_noresidual, ar_norm_fp8-static, ar_norm_fp8-group, "
                  "ar_norm_fp8-group-ue8m0, gather_context, gather_logits (repeatable)")
      ->check(CLI::IsMember(kOps));
  cmd->add_option("--vocab-shard", o->vocab_shard, "lm_head columns per rank")->capture_default_str()->check(CLI::Range(8, 1 << 20));
  cmd->add_option("--replays", o->replays, "timed graph replays per measurement")
      ->capture_default_str()
      ->check(positive_count());
  cmd->add_option("--calls", o->calls, "calls per graph")->capture_default_str()->check(CLI::Range(1, 1000));
  cmd->add_option("--eps", o->eps, "ar_norm's eps (a finite number >= 0)")
      ->capture_default_str()
      ->check(finite_non_negative("eps"));
  cmd->add_flag("--system-fence", o->system_fence, "a fence.acq_rel.sys before each thread's first push (its cost)");
  cmd->add_flag("--compare-invariant", o->compare_invariant,
                "also time the automatic choice in batch-invariant mode (CommConfig::batch_invariant)");
  cmd->add_flag("--fit", o->fit, "print the crossover table's entries fitted to this run (src/comm/crossover.hpp)");
  cmd->add_option("--json", o->json, "also write the rows as JSON to this file")->check(writable_file());
  cmd->callback([o] { run(*o); });
}

}  // namespace tpdecode::cli
