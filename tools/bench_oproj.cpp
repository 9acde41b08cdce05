// tpdecode bench oproj: PreparedOproj per team, epilogue and row count, each kind
// forced in turn (producer + consumer, fused, two-shot; unfused = DecodeGemm + TpComm's
// ArNorm, or + all_reduce + the AttnRes kernel) against stock (cuBLAS + NCCL or the
// local stock all-reduce + the separate norm / AttnRes kernel), the unfused path's
// GEMM alone and the producer's engine alone (the floor a fused kind cannot beat:
// it streams the same weight through it). CUDA-graph replays, median of many, over
// rotating weight copies (weight_rotation.hpp, counting every rank's weight on a
// GPU: every call reads HBM). The local team (one GPU playing
// TP ranks) measures protocol cost, not NVLink; the NCCL team runs one thread per
// GPU. Prints the rule-table rows (src/oproj/oproj_rules.cpp) the run supports.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/graph_timing.hpp"
#include "core/random_fill.hpp"
#include "core/streams.hpp"
#include "core/weight_rotation.hpp"
#include "gemm_shapes.hpp"
#include "json_file.hpp"
#include "oproj/oproj_kernels.hpp"
#include "oproj/oproj_rules.hpp"
#include "tpdecode/comm.hpp"
#include "tpdecode/cublas_context.hpp"
#include "tpdecode/decode_gemm.hpp"
#include "tpdecode/device_buffer.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/local_team.hpp"
#include "tpdecode/nccl_team.hpp"
#include "tpdecode/oproj.hpp"

namespace tpdecode::cli {
namespace {

constexpr int kRowsCap = 64;
constexpr int64_t kHidden = 7168;

struct Options {
  std::string team = "local";
  std::vector<int> tp;  // default: 8 on the local team, 2 on the NCCL team
  std::vector<int> rows = {1, 2, 4, 8, 16, 32, 64};
  std::vector<std::string> epilogues = {"ar_norm", "attn_res"};
  std::vector<std::string> kinds = {"producer-consumer", "fused", "two-shot"};  // the mailbox kinds timed
  int blocks = 4;  // AttnRes saved blocks
  int replays = 50;
  int calls = 10;  // calls per graph
  std::string json;
};

const char* const kMailboxKinds[] = {"producer-consumer", "fused", "two-shot"};

struct Cell {
  double us = 0;
  std::string why;  // not served: why
};

struct Row {
  std::string team;
  int tp = 0;
  int64_t k = 0;
  std::string epilogue;
  int m = 0;
  std::map<std::string, Cell> cells;
  std::string chosen;  // the kind the rule table takes
};

OprojEpilogue epilogue_of(const std::string& e) {
  return e == "ar_norm" ? OprojEpilogue::kArNorm : OprojEpilogue::kAttnRes;
}

// One driven rank's buffers at kRowsCap rows.
struct RankBuffers {
  std::vector<DeviceBuffer> weights;  // [copies] [H, K]
  DeviceBuffer x, residual, out, residual_out, partial, partial_out, blocks, scratch, reduced;
  std::shared_ptr<CublasContext> cublas;
};

DeviceBuffer filled(std::size_t bytes, uint64_t seed, float scale, cudaStream_t stream) {
  DeviceBuffer b(bytes);
  fill_uniform_bf16(b.get(), static_cast<int64_t>(bytes / 2), seed, scale, stream);
  return b;
}

class Workload {
 public:
  Workload(Team& team, int64_t k, const Options& o, std::size_t l2) : team_(team), k_(k), nb_(o.blocks) {
    const std::size_t w_bytes = static_cast<std::size_t>(kHidden * k) * 2;
    const std::size_t per_gpu = w_bytes * static_cast<std::size_t>(team.driven());
    copies_ = weight_copies(per_gpu, l2);
    const auto rows_h = static_cast<std::size_t>(kRowsCap * kHidden) * 2;
    TPD_CUDA(cudaSetDevice(team.device(0)));
    const cudaStream_t s = team.stream(0);
    norm_ = filled(static_cast<std::size_t>(kHidden) * 2, 1, 1.0f, s);
    g_ = filled(static_cast<std::size_t>(kHidden) * 2, 2, 1.0f, s);
    q_ = filled(static_cast<std::size_t>(kHidden) * 2, 3, 0.03f, s);
    for (int i = 0; i < team.driven(); ++i) {
      RankBuffers r;
      for (int c = 0; c < copies_; ++c)
        r.weights.push_back(filled(w_bytes, 100 + 10 * i + c, 1.0f / std::sqrt(static_cast<float>(k)), s));
      r.x = filled(static_cast<std::size_t>(kRowsCap * k) * 2, 200 + i, 1.0f, s);
      r.residual = filled(rows_h, 300 + i, 1.0f, s);
      r.partial = filled(rows_h, 400 + i, 1.0f, s);
      r.blocks = filled(rows_h * static_cast<std::size_t>(std::max(1, nb_)), 500 + i, 1.0f, s);
      r.out = DeviceBuffer(rows_h);
      r.residual_out = DeviceBuffer(rows_h);
      r.partial_out = DeviceBuffer(rows_h);
      r.scratch = DeviceBuffer(rows_h);
      r.reduced = DeviceBuffer(rows_h);
      r.cublas = std::make_shared<CublasContext>();
      ranks_.push_back(std::move(r));
    }
    TPD_CUDA(cudaDeviceSynchronize());
  }

  int copies() const { return copies_; }
  int64_t k() const { return k_; }

  // One PreparedOproj per weight copy (the layers of a model), sharing the mailbox.
  std::vector<std::unique_ptr<PreparedOproj>> prepare(TpComm& comm, std::shared_ptr<OprojMailbox> box, OprojEpilogue e,
                                                      const std::vector<int>& rows) {
    std::vector<std::unique_ptr<PreparedOproj>> ops;
    OprojOptions o;
    o.rows = rows;
    for (const RankBuffers& r : ranks_) o.cublas.push_back(r.cublas);
    for (int c = 0; c < copies_; ++c) {
      std::vector<TensorView> w;
      for (const RankBuffers& r : ranks_) w.push_back(weight(r, c));
      ops.push_back(std::make_unique<PreparedOproj>(comm, box, w, e, o));
    }
    return ops;
  }

  OprojResult run(PreparedOproj& op, int m, const std::vector<cudaStream_t>& streams) const {
    if (op.epilogue() == OprojEpilogue::kArNorm) {
      std::vector<OprojArNormIo> io;
      for (const RankBuffers& r : ranks_)
        io.push_back({rows(r.x, m, k_), rows(r.residual, m), rows(norm_, 1), 1e-6f, rows(r.out, m), rows(r.residual_out, m)});
      return op.run(io, streams);
    }
    std::vector<OprojAttnResIo> io;
    for (const RankBuffers& r : ranks_) io.push_back(attn_res_io(r, m));
    return op.run(io, streams);
  }

  // Stock: cuBLAS, then the stock collective (NCCL, or the local staging path) and
  // the separate norm, or the stock all-reduce and the AttnRes kernel.
  void stock(TpComm& comm, OprojEpilogue e, int copy, int m, const std::vector<cudaStream_t>& streams) const {
    for (int i = 0; i < team_.driven(); ++i) {
      const RankBuffers& r = ranks_[static_cast<std::size_t>(i)];
      r.cublas->gemm(rows(r.x, m, k_), weight(r, copy), rows(r.scratch, m), streams[static_cast<std::size_t>(i)]);
    }
    comm.set_algorithm(CommAlgorithm::kStock);
    if (e == OprojEpilogue::kArNorm) {
      std::vector<ArNormIo> io;
      for (const RankBuffers& r : ranks_)
        io.push_back({rows(r.scratch, m), rows(r.residual, m), rows(norm_, 1), 1e-6f, rows(r.out, m), rows(r.residual_out, m)});
      comm.ar_norm(io, streams);
    } else {
      std::vector<AllReduceIo> io;
      for (const RankBuffers& r : ranks_) io.push_back({rows(r.scratch, m), rows(r.reduced, m)});
      comm.all_reduce(io, streams);
      for (int i = 0; i < team_.driven(); ++i) {
        const RankBuffers& r = ranks_[static_cast<std::size_t>(i)];
        launch_attn_res(streams[static_cast<std::size_t>(i)], false, r.reduced.get(), tail(r, m), m,
                        static_cast<int>(kHidden));
      }
    }
    comm.set_algorithm(CommAlgorithm::kAuto);
  }

  // The unfused path's GEMM alone (DecodeGemm's decision), every rank at once.
  void gemm(std::vector<std::unique_ptr<DecodeGemm>>& gemms, int copy, int m,
            const std::vector<cudaStream_t>& streams) const {
    for (int i = 0; i < team_.driven(); ++i) {
      const RankBuffers& r = ranks_[static_cast<std::size_t>(i)];
      gemms[static_cast<std::size_t>(copy * team_.driven() + i)]->run(rows(r.x, m, k_), rows(r.scratch, m),
                                                                      streams[static_cast<std::size_t>(i)]);
    }
  }
  std::vector<std::unique_ptr<DecodeGemm>> make_gemms() const {
    std::vector<std::unique_ptr<DecodeGemm>> g;
    for (int c = 0; c < copies_; ++c)
      for (const RankBuffers& r : ranks_) g.push_back(std::make_unique<DecodeGemm>(weight(r, c), r.cublas));
    return g;
  }

 private:
  static TensorView rows(const DeviceBuffer& b, int m, int64_t cols = kHidden) {
    return TensorView::bf16(const_cast<void*>(b.get()), m, cols);
  }
  TensorView weight(const RankBuffers& r, int copy) const {
    return TensorView::bf16(const_cast<void*>(r.weights[static_cast<std::size_t>(copy)].get()), kHidden, k_);
  }
  OprojAttnResIo attn_res_io(const RankBuffers& r, int m) const {
    OprojAttnResIo io;
    io.x = rows(r.x, m, k_);
    io.partial = rows(r.partial, m);
    io.partial_out = rows(r.partial_out, m);
    if (nb_ > 0) io.blocks = rows(r.blocks, nb_ * m);
    io.key_norm = rows(g_, 1);
    io.query = rows(q_, 1);
    io.out_norm = rows(norm_, 1);
    io.out = rows(r.out, m);
    return io;
  }
  AttnResTail tail(const RankBuffers& r, int m) const {
    AttnResTail t{};
    t.partial = r.partial.get();
    t.partial_out = const_cast<void*>(r.partial_out.get());
    t.blocks = r.blocks.get();
    t.block_stride = static_cast<long>(m * kHidden);
    t.nb = nb_;
    t.key_norm = g_.get();
    t.query = q_.get();
    t.out_norm = norm_.get();
    t.eps = 1e-6f;
    t.out = const_cast<void*>(r.out.get());
    return t;
  }

  Team& team_;
  int64_t k_;
  int nb_;
  int copies_ = 1;
  DeviceBuffer norm_, g_, q_;
  std::vector<RankBuffers> ranks_;
};

double time_calls(Team& team, const std::function<void(int copy)>& enqueue, int copies, const Options& o) {
  std::vector<cudaStream_t> streams;
  for (int i = 0; i < team.driven(); ++i) streams.push_back(team.stream(i));
  enqueue(0);  // eager warm-up outside the capture
  team.synchronize();
  const int calls = rotation_calls(copies, o.calls);
  const GraphTiming t = time_graph(
      streams[0],
      [&](cudaStream_t origin, int call) {
        fork_streams(origin, streams);
        enqueue(call % copies);
        join_streams(origin, streams);
      },
      calls, o.replays);
  team.synchronize();
  return t.median_us;
}

// Every epilogue and row count on one team object; rows appended when `record`.
void measure(Team& team, const std::string& team_name, const Options& o, bool record, std::vector<Row>& out) {
  const Gpu gpu = require_gpu("bench oproj");
  const int64_t k = 96 * 128 / team.size();  // the drafter's o_proj shard
  CommConfig cc;
  cc.hidden = kHidden;
  cc.rows_cap = kRowsCap;
  TpComm comm(team, cc);
  auto box = std::make_shared<OprojMailbox>(team, kRowsCap, kHidden);
  Workload w(team, k, o, gpu.l2);
  std::vector<std::unique_ptr<DecodeGemm>> gemms = w.make_gemms();
  std::vector<std::unique_ptr<DecodeGemm>> engines = w.make_gemms();  // forced to the producer's engine and split
  std::vector<cudaStream_t> streams;
  for (int i = 0; i < team.driven(); ++i) streams.push_back(team.stream(i));
  for (const std::string& e : o.epilogues) {
    std::vector<std::unique_ptr<PreparedOproj>> ops = w.prepare(comm, box, epilogue_of(e), o.rows);
    for (int m : o.rows) {
      if (record) fmt::print(stderr, "  {} TP {} {} rows {}\n", team_name, team.size(), e, m);
      Row r{team_name, team.size(), k, e, m, {}, {}};
      const auto kind_cell = [&](OprojKind kind) {
        for (auto& op : ops) op->set_kind(kind);
        Cell c;
        const OprojResult plan = ops[0]->plan(m);
        if (plan.kind != kind) {
          c.why = plan.why;
          return c;
        }
        c.us = time_calls(team, [&](int copy) { w.run(*ops[static_cast<std::size_t>(copy)], m, streams); }, w.copies(), o);
        return c;
      };
      r.cells["unfused"] = kind_cell(OprojKind::kUnfused);
      for (OprojKind kind : {OprojKind::kProducerConsumer, OprojKind::kFused, OprojKind::kTwoShot}) {
        const std::string name = oproj_kind_name(kind);
        if (std::find(o.kinds.begin(), o.kinds.end(), name) != o.kinds.end())
          r.cells[name] = kind_cell(kind);
        else
          r.cells[name].why = "not asked for (--kind)";
      }
      r.cells["stock"].us = time_calls(team, [&](int copy) { w.stock(comm, epilogue_of(e), copy, m, streams); }, w.copies(), o);
      for (auto& g : gemms) g->prepare(m, team.stream(0));
      r.cells["gemm"].us = time_calls(team, [&](int copy) { w.gemm(gemms, copy, m, streams); }, w.copies(), o);
      for (auto& g : engines) g->force(m, warp_decision(ops[0]->producer_split(m)));
      r.cells["engine"].us = time_calls(team, [&](int copy) { w.gemm(engines, copy, m, streams); }, w.copies(), o);
      for (auto& op : ops) op->set_kind(std::nullopt);
      r.chosen = oproj_kind_name(ops[0]->plan(m).kind);
      if (record) out.push_back(r);
    }
  }
}

// The fastest mailbox kind of a row (empty when none ran).
std::string best_kind(const Row& r, double* us) {
  std::string best;
  *us = 0;
  for (const char* k : kMailboxKinds) {
    const Cell& c = r.cells.at(k);
    if (c.why.empty() && (best.empty() || c.us < *us)) best = k, *us = c.us;
  }
  return best;
}

std::string cell_text(const Cell& c) { return c.why.empty() ? fmt::format("{:.2f}", c.us) : "-"; }

void print_table(const std::vector<Row>& rows) {
  fmt::print("{:<6} {:>3} {:>6} {:<9} {:>4} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8}  {}\n", "team",
             "TP", "K", "epilogue", "M", "unfused", "prod-cons", "fused", "two-shot", "stock", "gemm", "engine",
             "best/unf", "stk/best", "gemm/unf", "rule");
  std::map<std::string, std::string> reasons;
  for (const Row& r : rows) {
    double best = 0;
    const std::string kind = best_kind(r, &best);
    const double unfused = r.cells.at("unfused").us;
    fmt::print("{:<6} {:>3} {:>6} {:<9} {:>4} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8.2f}  {}\n",
               r.team, r.tp, r.k, r.epilogue, r.m, cell_text(r.cells.at("unfused")),
               cell_text(r.cells.at("producer-consumer")), cell_text(r.cells.at("fused")),
               cell_text(r.cells.at("two-shot")), cell_text(r.cells.at("stock")), cell_text(r.cells.at("gemm")),
               cell_text(r.cells.at("engine")),
               kind.empty() ? "-" : fmt::format("{:.3f}", best / unfused),
               kind.empty() ? "-" : fmt::format("{:.2f}", r.cells.at("stock").us / best), r.cells.at("gemm").us / unfused,
               r.chosen);
    for (const auto& [name, c] : r.cells)
      if (!c.why.empty()) reasons.emplace(c.why, name);
  }
  fmt::print("\nµs per call (every rank), CUDA graphs, median of replays. best = the fastest of producer-consumer, "
             "fused and two-shot; gemm = the unfused path's GEMM alone (DecodeGemm's decision); engine = the producer's "
             "GEMM alone (the warp split-K engine at its split, writing its partial): a fused kind streams the same "
             "weight through it, so best >= engine, and best/unf >= engine/unf; rule = the kind the rule table "
             "runs.\n");
  for (const auto& [why, name] : reasons) fmt::print("  - {} not served: {}\n", name, why);

  // The o-projection targets (docs/performance.md, "Targets"): NCCL TP 2 and local TP 8,
  // M <= 8, ar_norm.
  for (const Row& r : rows) {
    if (r.epilogue != "ar_norm" || r.m > 8 || !((r.team == "nccl" && r.tp == 2) || (r.team == "local" && r.tp == 8)))
      continue;
    double best = 0;
    const std::string kind = best_kind(r, &best);
    if (kind.empty()) continue;
    const double vs_unfused = best / r.cells.at("unfused").us;
    const double vs_stock = r.cells.at("stock").us / best;
    fmt::print("target {} TP {} M {}: {} {:.3f} x unfused (<= 0.85 {}), {:.2f} x faster than stock (>= 1.5 {})\n",
               r.team, r.tp, r.m, kind, vs_unfused, vs_unfused <= 0.85 ? "met" : "MISSED", vs_stock,
               vs_stock >= 1.5 ? "met" : "MISSED");
  }

  // Rule-table rows this run supports: consecutive measured M (ascending) where the
  // best kind beat unfused by kOprojRuleGain, as one range.
  fmt::print("\nrule table rows supported by this run (src/oproj/oproj_rules.cpp):\n");
  for (std::size_t i = 0; i < rows.size();) {
    double best = 0;
    const std::string kind = best_kind(rows[i], &best);
    const Row& first = rows[i];
    if (kind.empty() || best * kOprojRuleGain > first.cells.at("unfused").us) {
      ++i;
      continue;
    }
    std::size_t j = i + 1;
    for (; j < rows.size(); ++j) {
      double b = 0;
      const Row& n = rows[j];
      if (n.team != first.team || n.tp != first.tp || n.epilogue != first.epilogue || best_kind(n, &b) != kind ||
          b * kOprojRuleGain > n.cells.at("unfused").us)
        break;
    }
    const Row& last = rows[j - 1];
    fmt::print("  {{TeamKind::{}, {}, {}, {}, OprojEpilogue::{}, {}, {}, OprojKind::{}, \"bench oproj: M {}-{}\"}},\n",
               first.team == "nccl" ? "kNccl" : "kLocal", first.tp, kHidden, first.k,
               first.epilogue == "ar_norm" ? "kArNorm" : "kAttnRes", first.m, last.m,
               kind == "fused" ? "kFused" : kind == "two-shot" ? "kTwoShot" : "kProducerConsumer", first.m, last.m);
    i = j;
  }
}

void write_json(const std::string& path, const std::vector<Row>& rows, const Options& o, const std::string& device) {
  nlohmann::json j;
  j["device"] = device;
  j["replays"] = o.replays;
  j["calls_per_graph"] = o.calls;
  j["blocks"] = o.blocks;
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json jr{{"team", r.team}, {"tp", r.tp},   {"hidden", kHidden}, {"k", r.k},
                      {"epilogue", r.epilogue}, {"m", r.m}, {"rule", r.chosen}};
    for (const auto& [name, c] : r.cells)
      jr[name] = c.why.empty() ? nlohmann::json{{"us", c.us}} : nlohmann::json{{"not_served", c.why}};
    j["rows"].push_back(jr);
  }
  write_json_file(path, j);
}

void run(Options o) {
  // Row counts ascending, once each: the rule-table rows below are ranges of them.
  std::sort(o.rows.begin(), o.rows.end());
  o.rows.erase(std::unique(o.rows.begin(), o.rows.end()), o.rows.end());
  o.tp = unique_in_order(o.tp);
  const Gpu gpu = require_gpu("bench oproj");
  int count = 0;
  TPD_CUDA(cudaGetDeviceCount(&count));
  std::vector<Row> rows;
  if (o.team == "local") {
    for (int tp : o.tp.empty() ? std::vector<int>{8} : o.tp) {
      fmt::print(stderr, "bench oproj: local team of {} ranks on {}\n", tp, gpu.name);
      LocalTeam team(tp);
      measure(team, "local", o, true, rows);
    }
  } else {
    std::string why;
    if (!nccl_team_available(&why)) throw Unavailable("bench oproj --team nccl: " + why);
    for (int tp : o.tp.empty() ? std::vector<int>{2} : o.tp) {
      if (tp > count)
        throw Unavailable(fmt::format("bench oproj --team nccl --tp {}: {} GPUs visible", tp, count));
      std::vector<int> devices;
      for (int d = 0; d < tp; ++d) devices.push_back(d);
      fmt::print(stderr, "bench oproj: NCCL team of {} GPUs ({})\n", tp, gpu.name);
      std::mutex mutex;
      NcclTeam::run_threads(devices, [&](NcclTeam& team) {
        std::vector<Row> mine;
        measure(team, "nccl", o, team.rank() == 0, mine);
        std::lock_guard<std::mutex> lock(mutex);
        rows.insert(rows.end(), mine.begin(), mine.end());
      });
    }
  }
  print_table(rows);
  if (!o.json.empty()) write_json(o.json, rows, o, gpu.name);
}

}  // namespace

void register_bench_oproj(CLI::App& app) {
  CLI::App* cmd = bench_group(app)->add_subcommand(
      "oproj", "PreparedOproj per kind (producer-consumer, fused, two-shot) vs unfused (DecodeGemm + ArNorm) and stock");
  auto o = std::make_shared<Options>();
  cmd->add_option("--team", o->team, "local (one GPU plays every rank) or nccl (one thread per GPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"local", "nccl"}));
  cmd->add_option("--tp", o->tp, "team sizes (repeatable; default 8 local, 2 nccl)")->check(CLI::IsMember({2, 4, 8, 16}));
  cmd->add_option("--rows", o->rows, "rows per call (repeatable; default 1 2 4 8 16 32 64)")->check(CLI::Range(1, kRowsCap));
  cmd->add_option("--epilogue", o->epilogues, "ar_norm, attn_res (repeatable; default both)")
      ->check(CLI::IsMember({"ar_norm", "attn_res"}));
  cmd->add_option("--kind", o->kinds, "mailbox kinds to time (repeatable; default all three)")
      ->check(CLI::IsMember({"producer-consumer", "fused", "two-shot"}));
  cmd->add_option("--blocks", o->blocks, "AttnRes saved blocks")->capture_default_str()->check(CLI::Range(0, kAttnResMaxBlocks));
  cmd->add_option("--replays", o->replays, "timed graph replays per measurement")
      ->capture_default_str()
      ->check(positive_count());
  cmd->add_option("--calls", o->calls, "calls per graph (at least; rounded up to whole rotations of the weight copies)")->capture_default_str()->check(CLI::Range(1, 1000));
  cmd->add_option("--json", o->json, "also write the rows as JSON to this file")->check(writable_file());
  cmd->callback([o] { run(*o); });
}

}  // namespace tpdecode::cli
