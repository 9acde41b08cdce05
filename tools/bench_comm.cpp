// tpdecode bench comm: the drafter's collectives (DrafterComm: ArNorm, the context
// and logits gathers) against the stock path (stock_comm.hpp) per op, TP, hidden
// size and row count; CUDA-graph replays, median of many. The local team (one GPU
// playing TP ranks, each on its own stream, all launched inside one graph)
// measures protocol cost, not NVLink; the NCCL team runs one thread per GPU.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_timing.hpp"
#include "commands.hpp"
#include "tpdecode/drafter_comm.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/local_team.hpp"
#include "tpdecode/nccl_team.hpp"
#include "tpdecode/random_fill.hpp"
#include "tpdecode/stock_comm.hpp"
#include "tpdecode/streams.hpp"

namespace tpdecode::cli {
namespace {

constexpr int kRowsCap = 64;

struct Options {
  std::string team = "local";
  int tp = 0;  // 0: 8 on the local team, every visible GPU (at most 8) on the NCCL team
  std::vector<int64_t> hidden = {7168};
  std::vector<int> rows = {1, 2, 4, 8, 16, 32, 64};
  std::vector<std::string> ops = {"ar_norm", "ar_norm_noresidual", "gather_context", "gather_logits"};
  int64_t vocab_shard = 20480;
  int replays = 200;
  int calls = 20;  // calls per graph (even: parities alternate across replays)
  std::string json;
};

struct Row {
  std::string op;
  int tp;
  int64_t hidden;
  int rows;
  std::string refused;  // "" when ours ran
  double ours_us = 0, stock_us = 0;
};

// One driven rank's tensors for every op, at kRowsCap rows (calls use the first rows).
struct RankTensors {
  void* x;         // [64, hidden] bf16: partial
  void* residual;  // [64, hidden]
  void* out;       // [64, hidden]
  void* res_out;   // [64, hidden]
  void* ctx_shard; // [64, hidden / TP]
  void* ctx_out;   // [64, hidden]
  void* logits_shard;  // [64, vocab_shard]
  void* logits_out;    // [64, TP · vocab_shard]
};

class Workload {
 public:
  Workload(Team& team, int64_t hidden, int64_t vocab_shard) : team_(team), hidden_(hidden), vocab_(vocab_shard) {
    const int tp = team.size();
    const auto rows_h = static_cast<std::size_t>(kRowsCap * hidden * 2);
    TPD_CUDA(cudaSetDevice(team.rank_context(0).device));
    weight_ = alloc(static_cast<std::size_t>(hidden * 2), 1);
    for (int i = 0; i < team.driven(); ++i) {
      RankTensors t;
      t.x = alloc(rows_h, 10 + i);
      t.residual = alloc(rows_h, 100 + i);
      t.out = alloc(rows_h, 0);
      t.res_out = alloc(rows_h, 0);
      t.ctx_shard = alloc(rows_h / tp, 200 + i);
      t.ctx_out = alloc(rows_h, 0);
      t.logits_shard = alloc(static_cast<std::size_t>(kRowsCap * vocab_shard * 2), 300 + i);
      t.logits_out = alloc(static_cast<std::size_t>(kRowsCap * vocab_shard * 2 * tp), 0);
      ranks_.push_back(t);
    }
    TPD_CUDA(cudaDeviceSynchronize());
  }
  ~Workload() {
    for (void* p : owned_) cudaFree(p);
  }
  Workload(const Workload&) = delete;
  Workload& operator=(const Workload&) = delete;

  ArNormIo ar_norm_io(int i, int rows, bool residual) const {
    const RankTensors& t = ranks_[static_cast<std::size_t>(i)];
    ArNormIo io;
    io.x = TensorView::bf16(t.x, rows, hidden_);
    if (residual) io.residual = TensorView::bf16(t.residual, rows, hidden_);
    io.weight = TensorView::bf16(weight_, 1, hidden_);
    io.out = TensorView::bf16(t.out, rows, hidden_);
    io.residual_out = TensorView::bf16(t.res_out, rows, hidden_);
    return io;
  }
  // (shard, out) of a gather op.
  std::pair<TensorView, TensorView> gather_io(int i, int rows, bool logits) const {
    const RankTensors& t = ranks_[static_cast<std::size_t>(i)];
    const int64_t s = logits ? vocab_ : hidden_ / team_.size();
    return {TensorView::bf16(logits ? t.logits_shard : t.ctx_shard, rows, s),
            TensorView::bf16(logits ? t.logits_out : t.ctx_out, rows, s * team_.size())};
  }

 private:
  void* alloc(std::size_t bytes, uint64_t seed) {
    void* p = nullptr;
    TPD_CUDA(cudaMalloc(&p, bytes));
    owned_.push_back(p);
    if (seed) fill_uniform_bf16(p, static_cast<int64_t>(bytes / 2), seed, 1.0f, nullptr);
    return p;
  }
  Team& team_;
  int64_t hidden_, vocab_;
  void* weight_ = nullptr;
  std::vector<RankTensors> ranks_;
  std::vector<void*> owned_;
};

// One call of `op` on every driven rank: ours (returns false if not served) or stock.
bool enqueue_call(const std::string& op, bool ours, Team& team, DrafterComm& comm, StockComm& stock,
                  const Workload& w, int rows, int parity) {
  const bool is_ar = op == "ar_norm" || op == "ar_norm_noresidual";
  if (is_ar) {
    std::vector<ArNormIo> io;
    for (int i = 0; i < team.driven(); ++i) io.push_back(w.ar_norm_io(i, rows, op == "ar_norm"));
    if (!ours) {
      stock.ar_norm(io);
      return true;
    }
    for (int i = 0; i < team.driven(); ++i)
      if (!comm.ar_norm(i, io[static_cast<std::size_t>(i)], parity)) return false;
    return true;
  }
  const bool logits = op == "gather_logits";
  std::vector<TensorView> shard, out;
  for (int i = 0; i < team.driven(); ++i) {
    auto [s, o] = w.gather_io(i, rows, logits);
    shard.push_back(s);
    out.push_back(o);
  }
  if (!ours) {
    stock.all_gather(shard, out);
    return true;
  }
  for (int i = 0; i < team.driven(); ++i) {
    const auto k = static_cast<std::size_t>(i);
    if (!(logits ? comm.gather_logits(i, shard[k], out[k], parity) : comm.gather_context(i, shard[k], out[k], parity)))
      return false;
  }
  return true;
}

bench::Timing time_op(const std::string& op, bool ours, Team& team, DrafterComm& comm, StockComm& stock,
                      const Workload& w, int rows, const Options& o) {
  std::vector<cudaStream_t> streams;
  for (int i = 0; i < team.driven(); ++i) streams.push_back(team.rank_context(i).stream);
  const bench::Timing t = bench::time_graph(
      streams[0],
      [&](cudaStream_t origin, int call) {
        fork_streams(origin, streams);
        enqueue_call(op, ours, team, comm, stock, w, rows, call % 2);
        join_streams(origin, streams);
      },
      o.calls, o.replays);
  team.synchronize();
  team.check_errors();
  return t;
}

std::string refusal(const std::string& op, const DrafterComm& comm, const Workload& w, int rows) {
  if (op == "ar_norm" || op == "ar_norm_noresidual")
    return ar_norm_refusal(comm.limits(), w.ar_norm_io(0, rows, op == "ar_norm"));
  const bool logits = op == "gather_logits";
  const auto [shard, out] = w.gather_io(0, rows, logits);
  return logits ? gather_logits_refusal(comm.limits(), shard, out) : gather_context_refusal(comm.limits(), shard, out);
}

// Every (hidden, op, rows) on one team object; rows appended when `record`.
void measure(Team& team, const Options& o, bool record, std::vector<Row>& out) {
  for (int64_t hidden : o.hidden) {
    DrafterCommConfig config;
    config.hidden = hidden;
    config.rows_cap = kRowsCap;
    config.context_rows_cap = kRowsCap;
    config.vocab_shard = o.vocab_shard;
    std::string why;
    std::unique_ptr<DrafterComm> comm = DrafterComm::build(team, config, &why);
    if (!comm) throw Unavailable(fmt::format("bench comm: DrafterComm not built for H {}: {}", hidden, why));
    StockCommConfig sc;
    sc.rows_cap = kRowsCap;
    sc.max_row_bytes = std::max(hidden, o.vocab_shard) * 2;
    StockComm stock(team, sc);
    Workload w(team, hidden, o.vocab_shard);
    for (const std::string& op : o.ops) {
      for (int rows : o.rows) {
        if (record) fmt::print(stderr, "  {} TP {} H {} rows {}\n", op, team.size(), hidden, rows);
        Row r{op, team.size(), hidden, rows, refusal(op, *comm, w, rows)};
        if (r.refused.empty()) {
          enqueue_call(op, true, team, *comm, stock, w, rows, 0);  // eager warm-up outside the capture
          enqueue_call(op, true, team, *comm, stock, w, rows, 1);
          // Why: the graph is captured on rank 0's stream only; every rank's warm-up
          // (re-arms included) must be done before the first replay pushes again.
          team.synchronize();
          r.ours_us = time_op(op, true, team, *comm, stock, w, rows, o).median_us;
        }
        enqueue_call(op, false, team, *comm, stock, w, rows, 0);
        team.synchronize();
        r.stock_us = time_op(op, false, team, *comm, stock, w, rows, o).median_us;
        if (record) out.push_back(r);
      }
    }
  }
}

void print_table(const std::vector<Row>& rows, const std::string& team) {
  fmt::print("{:<20} {:>3} {:>6} {:>5} {:>20} {:>10} {:>7}\n", "op", "TP", "H", "rows", "specialised us",
             "stock us", "ratio");
  for (const Row& r : rows) {
    const std::string ours = r.refused.empty() ? fmt::format("{:.2f}", r.ours_us) : "refused (capacity)";
    const std::string ratio = r.refused.empty() ? fmt::format("{:.2f}", r.stock_us / r.ours_us) : "-";
    fmt::print("{:<20} {:>3} {:>6} {:>5} {:>20} {:>10.2f} {:>7}\n", r.op, r.tp, r.hidden, r.rows, ours, r.stock_us,
               ratio);
  }
  fmt::print("\nratio = stock / specialised; per call, all ranks, inside a CUDA graph, median of replays.\n");
  if (team == "local")
    fmt::print("Local team: every rank on this one GPU; this measures protocol cost, not NVLink.\n");
}

void write_json(const std::string& path, const std::vector<Row>& rows, const Options& o, const std::string& device) {
  nlohmann::json j;
  j["team"] = o.team;
  j["device"] = device;
  j["replays"] = o.replays;
  j["calls_per_graph"] = o.calls;
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows)
    j["rows"].push_back({{"op", r.op},
                         {"tp", r.tp},
                         {"hidden", r.hidden},
                         {"rows", r.rows},
                         {"refused", r.refused},
                         {"specialised_us", r.refused.empty() ? nlohmann::json(r.ours_us) : nlohmann::json()},
                         {"stock_us", r.stock_us},
                         {"ratio", r.refused.empty() ? nlohmann::json(r.stock_us / r.ours_us) : nlohmann::json()}});
  std::ofstream(path) << j.dump(2) << "\n";
}

void run(const Options& o) {
  for (const std::string& op : o.ops)
    require(op == "ar_norm" || op == "ar_norm_noresidual" || op == "gather_context" || op == "gather_logits",
            fmt::format("bench comm: unknown --op {}", op));
  for (int r : o.rows) require(r >= 1 && r <= kRowsCap, fmt::format("bench comm: --rows {} outside 1 ... 64", r));
  require(o.calls >= 2 && o.calls % 2 == 0 && o.replays >= 1, "bench comm: --calls must be even, --replays positive");
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw Unavailable("bench comm needs a CUDA GPU; none is visible here");
  }
  cudaDeviceProp prop{};
  TPD_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::vector<Row> rows;
  if (o.team == "local") {
    const int tp = o.tp ? o.tp : 8;
    fmt::print(stderr, "bench comm: local team of {} ranks on {}\n", tp, prop.name);
    LocalTeam team(tp);
    measure(team, o, true, rows);
  } else if (o.team == "nccl") {
    std::string why;
    if (!nccl_team_available(&why)) throw Unavailable("bench comm --team nccl: " + why);
    if (count < 2)
      throw Unavailable(fmt::format("bench comm --team nccl needs at least 2 GPUs; {} visible. Use --team local", count));
    const int tp = o.tp ? o.tp : std::min(count, 8);
    require(tp <= count, fmt::format("bench comm: --tp {} but {} GPUs visible", tp, count));
    std::vector<int> devices;
    for (int d = 0; d < tp; ++d) devices.push_back(d);
    fmt::print(stderr, "bench comm: NCCL team of {} GPUs ({})\n", tp, prop.name);
    std::mutex m;
    NcclTeam::run_threads(devices, [&](NcclTeam& team) {
      std::vector<Row> mine;
      measure(team, o, team.rank() == 0, mine);
      std::lock_guard<std::mutex> lock(m);
      if (team.rank() == 0) rows = mine;
    });
  } else {
    throw InvalidArgument(fmt::format("bench comm: --team {} (local or nccl)", o.team));
  }
  print_table(rows, o.team);
  if (!o.json.empty()) write_json(o.json, rows, o, prop.name);
}

}  // namespace

void register_bench_comm(CLI::App& app) {
  CLI::App* cmd = bench_group(app)->add_subcommand("comm", "DrafterComm collectives vs the stock path, per op and rows");
  auto o = std::make_shared<Options>();
  cmd->add_option("--team", o->team, "local (one GPU plays every rank) or nccl (one thread per GPU)")
      ->capture_default_str();
  cmd->add_option("--tp", o->tp, "team size (default: 8 local; visible GPUs, at most 8, nccl)");
  cmd->add_option("--hidden", o->hidden, "hidden sizes (repeatable; 4096, 5120, 7168, 8192)");
  cmd->add_option("--rows", o->rows, "rows per call (repeatable; default 1 2 4 8 16 32 64)");
  cmd->add_option("--op", o->ops, "ar_norm, ar_norm_noresidual, gather_context, gather_logits (repeatable)");
  cmd->add_option("--vocab-shard", o->vocab_shard, "lm_head columns per rank")->capture_default_str();
  cmd->add_option("--replays", o->replays, "timed graph replays per measurement")->capture_default_str();
  cmd->add_option("--calls", o->calls, "calls per graph (even)")->capture_default_str();
  cmd->add_option("--json", o->json, "also write the rows as JSON to this file");
  cmd->callback([o] { run(*o); });
}

}  // namespace tpdecode::cli
