// tpdecode bench chain: the per-rank GEMMs of the synthetic drafter's layers
// (distinct weights per layer, rotating over copies where the layers are fewer bytes
// than weight_rotation.hpp asks for, so nothing stays in L2) and the lm_head, at TP 1, 2,
// 4 and 8 shapes, back to back in one CUDA graph: stock (cuBLAS) against ours
// (DecodeGemm, measured dispatch for chain links, PDL), bytes / time against the read ceiling
// measured in the same run, and what a plain streaming read of the same buffers
// takes (ordinary launches and PDL: what the hardware allows for such a chain). With
// --silu-mul and --norms the layers carry their TP 1 glue (chain_glue.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "chain_glue.hpp"
#include "commands.hpp"
#include "core/check.hpp"
#include "core/graph_timing.hpp"
#include "core/random_fill.hpp"
#include "core/weight_rotation.hpp"
#include "gemm_shapes.hpp"
#include "json_file.hpp"
#include "program/program_timeline.hpp"
#include "read_ceiling.hpp"
#include "tpdecode/decode_gemm.hpp"
#include "tpdecode/device_buffer.hpp"
#include "tpdecode/gemm_program.hpp"

namespace tpdecode::cli {
namespace {

struct Options {
  std::vector<int> tps = {8, 4, 2, 1};
  std::vector<int> ms = {1, 8, 16, 28};
  int layers = 5;
  int replays = 20;
  std::vector<std::string> force;  // chains also timed with every link forced (forced_decision)
  bool timeline = false;           // the programs record their timelines (boundary_figures)
  bool silu_mul = false;           // the layers' SiLU-mul (chain_glue.hpp)
  bool norms = false;              // the layers' norms and residual adds (chain_glue.hpp)
  bool fold_norms = false;         // the program's norms folded where a GEMM reads them (chain_glue.hpp)
  std::string json;
};

struct Row {
  int tp = 0;
  int m = 0;
  std::string chain;  // "layers" or "layers+lm_head"
  double bytes = 0;
  double stock_us = 0, ours_us = 0, read_us = 0, read_pdl_us = 0;
  double program_us = std::numeric_limits<double>::infinity();  // GemmProgram (infinite: M it does not serve)
  double free_us = std::numeric_limits<double>::infinity();     // the same program, no op reading another
  std::vector<double> forced_us;  // per Options::force (infinite: a link the forced path cannot run)
  std::string paths;  // e.g. "cublas 5, warp 20"
  std::vector<std::string> links;  // each link of the first set's chain: "name NxK: what ran (its tuned us)"
  // With --timeline: the first set's program's boundaries, and its free form's.
  std::optional<program::BoundaryFigures> program_timeline, free_timeline;
  std::vector<GemmProgram::RunTimeline> program_runs;  // with --timeline: the raw per-CTA times behind them
};

// One link of the chain: a weight and its DecodeGemm.
struct Link {
  GemmShape shape;
  DeviceBuffer weight;  // [N, K] bf16
  std::unique_ptr<DecodeGemm> gemm;
};

// What --force NAME runs on a link: "warp" (the warp engine at the rule's split, its
// split for 32 rows above 32) or "cublas"; none where it cannot.
std::optional<GemmDecision> forced_decision(const std::string& name, const GemmShape& s, int m) {
  if (name == "cublas") return cublas_decision();
  if (name == "warp") {
    if (!warp_eligible(s.n, s.k) || m > kWarpMaxRows) return std::nullopt;
    int device = 0, sms = 0;
    TPD_CUDA(cudaGetDevice(&device));
    TPD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return warp_decision(choose_tactic(s.n, s.k, std::min(m, kWarpCandidateMaxRows), sms).split);
  }
  return std::nullopt;
}

bool valid_force(const std::string& name) { return name == "cublas" || name == "warp"; }

std::string path_counts(const std::vector<Link>& links, const std::vector<std::size_t>& chain, int m) {
  std::map<std::string, int> count;
  for (std::size_t i : chain) ++count[gemm_path_name(links[i].gemm->path(m))];
  std::string s;
  for (const auto& [path, n] : count) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", path, n);
  return s;
}

void bench_tp(int tp, const Options& o, const Gpu& gpu, cudaStream_t stream, std::vector<Row>& rows) {
  const std::vector<GemmShape> layer = layer_shapes(tp);
  double layers_bytes = 0;
  for (const GemmShape& s : layer) layers_bytes += s.bytes() * o.layers;
  // Why sets: a graph replays its chains back to back, so a chain of fewer bytes than
  // the rotation rule asks for (a few layers) rotates over copies of its layers;
  // call c of a graph runs set c. The lm_head (one copy) ends every chain with it.
  const int sets = weight_copies(static_cast<std::size_t>(layers_bytes), gpu.l2);
  auto cublas = std::make_shared<CublasContext>();
  std::vector<Link> links;  // every set's layer GEMMs in order, then the lm_head
  uint64_t seed = 100;
  auto add = [&](const GemmShape& s) {
    Link l{s, DeviceBuffer(static_cast<std::size_t>(s.bytes())), nullptr};
    fill_uniform_bf16(l.weight.get(), s.n * s.k, seed++, 0.05f, stream);
    l.gemm = std::make_unique<DecodeGemm>(TensorView::bf16(l.weight.get(), s.n, s.k), cublas);
    l.gemm->set_chain(true);
    links.push_back(std::move(l));
  };
  for (int set = 0; set < sets; ++set)
    for (int l = 0; l < o.layers; ++l)
      for (const GemmShape& s : layer) add(s);
  add(drafter_shapes(tp)[5]);  // lm_head
  const std::size_t per_set = layer.size() * static_cast<std::size_t>(o.layers);
  auto chain = [&](int set, bool with_head) {  // the links of one chain, in order
    std::vector<std::size_t> c(per_set);
    for (std::size_t i = 0; i < per_set; ++i) c[i] = static_cast<std::size_t>(set) * per_set + i;
    if (with_head) c.push_back(links.size() - 1);
    return c;
  };
  const int max_m = *std::max_element(o.ms.begin(), o.ms.end());
  const ChainGlue glue(layer, sets * o.layers, o.layers, max_m, o.silu_mul, o.norms, o.fold_norms, stream);
  auto layer_link = [&](std::size_t i) { return i + 1 < links.size(); };  // not the lm_head
  std::map<int64_t, DeviceBuffer> xs;  // by K: [max_m, K] bf16
  std::vector<DeviceBuffer> outs;      // by link: [max_m, N] bf16
  for (const Link& l : links) {
    if (!xs.count(l.shape.k)) {
      xs.emplace(l.shape.k, DeviceBuffer(static_cast<std::size_t>(max_m * l.shape.k) * 2));
      fill_uniform_bf16(xs.at(l.shape.k).get(), max_m * l.shape.k, 7, 1.0f, stream);
    }
    outs.emplace_back(static_cast<std::size_t>(max_m * l.shape.n) * 2);
  }
  for (int m : o.ms) {
    // Decided as one chain of adjacent links (each shape tuned once, as a chain link and
    // where that took a PDL path also alone): every set's layers in launch order, then
    // the lm_head.
    std::vector<DecodeGemm*> in_order;
    for (Link& l : links) in_order.push_back(l.gemm.get());
    DecodeGemm::decide_adjacent(in_order, m, stream);
    for (bool with_head : {false, true}) {
      std::vector<std::vector<std::size_t>> chains;  // [set]
      for (int set = 0; set < sets; ++set) chains.push_back(chain(set, with_head));
      auto input_of = [&](std::size_t i) {
        return TensorView::bf16(xs.at(links[i].shape.k).get(), m, links[i].shape.k);
      };
      auto x_of = [&](std::size_t i) { return layer_link(i) ? glue.x(i, m, input_of(i)) : input_of(i); };
      auto out_of = [&](std::size_t i) { return TensorView::bf16(outs[i].get(), m, links[i].shape.n); };
      // Median microseconds per chain of `run(link index, stream)` over every link,
      // with the glue around the layers' links (pdl: the glue kernels'; ours: yes,
      // as the drafter's specialised path).
      auto time_chains = [&](const std::function<void(std::size_t, cudaStream_t)>& run, bool pdl) {
        return time_graph(
                   stream,
                   [&](cudaStream_t st, int c) {
                     for (std::size_t i : chains[static_cast<std::size_t>(c)]) {
                       if (!layer_link(i)) {
                         run(i, st);
                         continue;
                       }
                       if (i > 0) glue.before(i, m, out_of(i - 1), st, pdl);
                       run(i, st);
                       glue.after(i, m, out_of(i), st, pdl);
                     }
                   },
                   sets, o.replays)
            .median_us;
      };
      Row r;
      r.tp = tp;
      r.m = m;
      r.chain = with_head ? "layers+lm_head" : "layers";
      std::vector<bench::ReadBuffer> buffers;  // every set's chain, in call order
      for (const std::vector<std::size_t>& c : chains)
        for (std::size_t i : c) buffers.push_back({links[i].weight.get(), links[i].weight.bytes()});
      for (std::size_t i : chains[0]) r.bytes += links[i].shape.bytes();
      r.stock_us = time_chains(
          [&](std::size_t i, cudaStream_t st) { cublas->gemm(x_of(i), links[i].gemm->weight(), out_of(i), st); },
          false);
      r.ours_us =
          time_chains([&](std::size_t i, cudaStream_t st) { links[i].gemm->run(x_of(i), out_of(i), st); }, true);
      if (m <= GemmProgram::kMaxRows) {
        // One program per set: the chain's GEMMs in order, each reading the first
        // K columns of the previous one's out (the dependency a chain of linears
        // has; every drafter link's K fits its predecessor's N); `free`: every x an
        // input (what the dependency costs). The glue: chained, its ops in the program
        // (the SiLU-mul epilogue, Norm ops, which the next GEMM reads); free, the
        // SiLU-mul epilogue only.
        auto time_program = [&](bool chained, std::optional<program::BoundaryFigures>& timeline,
                                std::vector<GemmProgram::RunTimeline>* raw) {
          std::vector<std::unique_ptr<GemmProgram>> programs;
          for (const std::vector<std::size_t>& c : chains) {
            std::vector<GemmProgram::Op> ops;
            int feed = -1;  // the op whose out the next GEMM reads
            TensorView feed_out;
            for (std::size_t p = 0; p < c.size(); ++p) {
              const std::size_t i = c[p];
              GemmProgram::Gemm g{links[i].gemm->weight(), input_of(i), out_of(i), -1};
              if (p + 1 < c.size() && layer_link(c[p + 1]) && glue.silu_epilogue(c[p + 1])) {
                g.out.cols /= 2;
                g.out.row_stride = g.out.cols;
                g.epilogue = GemmProgram::Epilogue::kSiluMul;
              }
              if (chained && feed >= 0 && links[i].shape.k <= feed_out.cols) {
                g.x = feed_out;
                g.x.cols = links[i].shape.k;
                g.after = feed;
              }
              ops.push_back(g);
              feed = static_cast<int>(ops.size()) - 1;
              feed_out = g.out;
              if (chained && layer_link(i)) {
                feed = glue.append_norms(i, m, feed, g.out, ops);
                feed_out = ops[static_cast<std::size_t>(feed)].is_norm ? ops[static_cast<std::size_t>(feed)].norm.out
                                                                       : g.out;
              }
            }
            programs.push_back(std::make_unique<GemmProgram>(std::move(ops), m, o.timeline));
          }
          const double us =
              time_graph(
                  stream, [&](cudaStream_t st, int c) { programs[static_cast<std::size_t>(c)]->run(st); }, sets,
                  o.replays)
                  .median_us;
          if (o.timeline) {
            std::vector<GemmProgram::RunTimeline> runs = programs[0]->timelines();
            timeline = program::boundary_figures(runs, programs[0]->ops());
            if (raw != nullptr) *raw = std::move(runs);
          }
          return us;
        };
        r.program_us = time_program(true, r.program_timeline, &r.program_runs);
        r.free_us = time_program(false, r.free_timeline, nullptr);
      }
      for (const std::string& name : o.force) {
        std::map<std::size_t, std::unique_ptr<DecodeGemm>> forced;  // by link
        bool runs = true;
        for (const std::vector<std::size_t>& c : chains)
          for (std::size_t i : c) {
            const std::optional<GemmDecision> d = forced_decision(name, links[i].shape, m);
            if (!d) runs = false;
            if (!runs || forced.count(i)) continue;
            forced[i] = std::make_unique<DecodeGemm>(links[i].gemm->weight(), cublas);
            forced[i]->force(m, *d);
          }
        r.forced_us.push_back(
            runs ? time_chains([&](std::size_t i, cudaStream_t st) { forced.at(i)->run(x_of(i), out_of(i), st); },
                               true)
                 : std::numeric_limits<double>::infinity());
      }
      r.read_us = bench::time_read_chain(buffers, false, o.replays, stream) / sets;
      r.read_pdl_us = bench::time_read_chain(buffers, true, o.replays, stream) / sets;
      r.paths = path_counts(links, chains[0], m);
      for (std::size_t i : chains[0]) {
        const DecodeGemm& g = *links[i].gemm;
        const GemmShape& sh = links[i].shape;
        const bool decided = g.prepared(m) && g.path(m) == g.decision(m).path;
        r.links.push_back(decided ? fmt::format("{} {}x{}: {} ({:.2f} us tuned)", sh.name, sh.n, sh.k,
                                                tactic_of(g.decision(m), sh.n, sh.k, m), g.decision(m).measured_us)
                                  : fmt::format("{} {}x{}: {}", sh.name, sh.n, sh.k, gemm_path_name(g.path(m))));
      }
      rows.push_back(r);
    }
  }
}

void print_table(const std::vector<Row>& rows, const bench::ReadCeiling& ceiling, const Options& o) {
  fmt::print("\n{:>3} {:>3} {:<15} {:>7} {:>9} {:>9} {:>6} {:>6} {:>6} {:>9} {:>6} {:>9} {:>6} {:>9} {:>6} {:>9} {:>6}  {}\n",
             "TP", "M", "chain", "MB", "stock us", "ours us", "x", "%stock", "%ours", "prog us", "%prog", "free us",
             "%free", "read us", "%read", "readPDL", "%rPDL", "paths (ours)");
  auto pct = [&](const Row& r, double us) { return 100.0 * r.bytes / (ceiling.tb_per_s * 1e6) / us; };
  for (const Row& r : rows) {
    fmt::print("{:>3} {:>3} {:<15} {:>7.0f} {:>9.1f} {:>9.1f} {:>6.2f} {:>5.0f}% {:>5.0f}% {:>9.1f} {:>5.0f}% {:>9.1f} "
               "{:>5.0f}% {:>9.1f} {:>5.0f}% {:>9.1f} {:>5.0f}%  {}\n",
               r.tp, r.m, r.chain, r.bytes / 1e6, r.stock_us, r.ours_us, r.stock_us / r.ours_us, pct(r, r.stock_us),
               pct(r, r.ours_us), r.program_us, pct(r, r.program_us), r.free_us, pct(r, r.free_us), r.read_us,
               pct(r, r.read_us), r.read_pdl_us, pct(r, r.read_pdl_us), r.paths);
    for (std::size_t i = 0; i < r.forced_us.size(); ++i)
      if (std::isfinite(r.forced_us[i]))
        fmt::print("{:>27} {:>17} {:>9.1f} {:>13} {:>5.0f}%\n", "", "forced " + o.force[i], r.forced_us[i], "",
                   pct(r, r.forced_us[i]));
      else
        fmt::print("{:>27} {:>17} {:>9}  (a link the forced path cannot run)\n", "", "forced " + o.force[i], "-");
  }
  fmt::print(
      "\nOne CUDA graph per chain: the per-rank GEMMs of the drafter's layers (distinct weights per layer) and, in "
      "'+lm_head', the vocabulary shard. stock = cublasGemmEx (default algorithm); ours = DecodeGemm (tuned as chain links, PDL); "
      "prog = the chain as one GemmProgram (each GEMM reads the previous one's out); free = that program with every "
      "x an input (no op waits for another); x = stock / ours; forced NAME = every link forced to that path (--force); %% = weight bytes / read ceiling / "
      "time; read = a plain streaming read of the same buffers, "
      "ordinary launches and with PDL (what the hardware allows). Read ceiling {:.2f} TB/s.{}\n",
      ceiling.tb_per_s,
      o.silu_mul || o.norms
          ? fmt::format(" With the layers' TP 1 glue ({}{}): stock and ours (and forced) run the drafter's kernels "
                        "between the GEMMs (ours with PDL), prog runs it as ops of the program (free: the SiLU-mul "
                        "epilogue only).",
                        o.silu_mul ? "SiLU-mul" : "", o.norms ? (o.silu_mul ? ", norms" : "norms") : "")
          : std::string());
  if (o.timeline) {
    fmt::print(
        "\nThe programs' boundaries (--timeline; the first set's program, means over its last runs' ops, us):"
        " span = a run; late = an op's last MMA end - the median CTA's; epi = the last epilogue's end - the"
        " last MMA end; start = the median CTA's start of an op - the previous op's last MMA end; last ="
        " the last CTA's start - that; full / cap = a run's time the mean CTA's weight producer waited for a"
        " free ring stage / under its cap on the bytes in flight\n");
    fmt::print("{:>3} {:>3} {:<15} {:>5} {:>8} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6}   {:>8} {:>6} {:>6} {:>6} {:>6}\n",
               "TP", "M", "chain", "runs", "prog", "late", "epi", "start", "last", "full", "cap", "free", "late", "epi",
               "full", "cap");
    for (const Row& r : rows) {
      if (!r.program_timeline || !r.free_timeline) continue;
      const program::BoundaryFigures& p = *r.program_timeline;
      const program::BoundaryFigures& f = *r.free_timeline;
      fmt::print(
          "{:>3} {:>3} {:<15} {:>5} {:>8.1f} {:>6.2f} {:>6.2f} {:>6.2f} {:>6.2f} {:>6.1f} {:>6.1f}   {:>8.1f} {:>6.2f} "
          "{:>6.2f} {:>6.1f} {:>6.1f}\n",
          r.tp, r.m, r.chain, p.runs, p.span_us, p.lateness_us, p.epilogue_us, p.start_us, p.last_start_us,
          p.ring_full_us, p.capped_us, f.span_us, f.lateness_us, f.epilogue_us, f.ring_full_us, f.capped_us);
    }
  }
  // The chain targets (docs/performance.md, "Targets"): the layers' chain at TP 8 >= 90 %
  // of the read ceiling at M <= 8 and >= 88 % at M 28-64, TP 4 >= 92 %, TP 1 >= 96 %;
  // a row counts its better form (the launches or the program: a step may run either).
  for (const auto& [tp, percent, min_m, max_m] : {std::tuple{8, 90.0, 1, 8}, std::tuple{8, 88.0, 28, 64},
                                                  std::tuple{4, 92.0, 1, 64}, std::tuple{1, 96.0, 1, 64}}) {
    double lowest = 1e9, lowest_launches = 1e9, lowest_program = 1e9;
    int count = 0;
    for (const Row& r : rows)
      if (r.tp == tp && r.chain == "layers" && r.m >= min_m && r.m <= max_m) {
        ++count;
        lowest = std::min(lowest, std::max(pct(r, r.ours_us), pct(r, r.program_us)));
        lowest_launches = std::min(lowest_launches, pct(r, r.ours_us));
        lowest_program = std::min(lowest_program, pct(r, r.program_us));
      }
    if (count > 0)
      fmt::print("target TP {} layers at M {}-{} >= {:.0f} %: lowest {:.1f} % over {} rows (the better form of each) "
                 "-> {} (launches: lowest {:.1f} %, as one program: lowest {:.1f} %)\n",
                 tp, min_m, max_m, percent, lowest, count, lowest >= percent ? "met" : "missed", lowest_launches,
                 lowest_program);
  }
}

void write_json(const std::string& path, const std::vector<Row>& rows, const bench::ReadCeiling& ceiling,
                const Gpu& gpu, const Options& o) {
  nlohmann::json j;
  j["device"] = {{"name", gpu.name}, {"sms", gpu.sms}, {"l2_bytes", gpu.l2}};
  j["read_ceiling"] = {{"tb_per_s", ceiling.tb_per_s}, {"bytes", ceiling.bytes}, {"median_us", ceiling.median_us}};
  j["layers"] = o.layers;
  j["silu_mul"] = o.silu_mul;
  j["norms"] = o.norms;
  j["fold_norms"] = o.fold_norms;
  j["replays"] = o.replays;
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows) {
    const double floor_us = r.bytes / (ceiling.tb_per_s * 1e6);
    j["rows"].push_back({{"tp", r.tp},
                         {"m", r.m},
                         {"chain", r.chain},
                         {"mb", r.bytes / 1e6},
                         {"stock_us", r.stock_us},
                         {"ours_us", r.ours_us},
                         {"program_us", std::isfinite(r.program_us) ? nlohmann::json(r.program_us) : nlohmann::json()},
                         {"program_free_us", std::isfinite(r.free_us) ? nlohmann::json(r.free_us) : nlohmann::json()},
                         {"read_us", r.read_us},
                         {"read_pdl_us", r.read_pdl_us},
                         {"floor_us", floor_us},
                         {"stock_fraction_of_ceiling", floor_us / r.stock_us},
                         {"ours_fraction_of_ceiling", floor_us / r.ours_us},
                         {"paths", r.paths},
                         {"links", r.links}});
    for (std::size_t i = 0; i < r.forced_us.size(); ++i)
      j["rows"].back()["forced_us"][o.force[i]] =
          std::isfinite(r.forced_us[i]) ? nlohmann::json(r.forced_us[i]) : nlohmann::json();  // null: not run
    auto figures = [](const program::BoundaryFigures& b) {
      return nlohmann::json{{"runs", b.runs},
                            {"span_us", b.span_us},
                            {"lateness_us", b.lateness_us},
                            {"epilogue_us", b.epilogue_us},
                            {"start_us", b.start_us},
                            {"last_start_us", b.last_start_us},
                            {"ring_full_us", b.ring_full_us},
                            {"capped_us", b.capped_us}};
    };
    if (r.program_timeline) j["rows"].back()["program_timeline"] = figures(*r.program_timeline);
    if (r.free_timeline) j["rows"].back()["program_free_timeline"] = figures(*r.free_timeline);
    // Per run: the SM of each CTA and, per op, each CTA's start, last MMA end,
    // epilogue end and producer waits (ns; CTA c's op o at c * ops + o), for analyses the figures lack
    // (e.g. whether the late CTAs are the same SMs from op to op).
    for (const GemmProgram::RunTimeline& run : r.program_runs) {
      nlohmann::json t{{"sm", run.sm}};
      for (const GemmProgram::OpTimes& op : run.ops) {
        t["start_ns"].push_back(op.start_ns);
        t["mma_end_ns"].push_back(op.mma_end_ns);
        t["epilogue_end_ns"].push_back(op.epilogue_end_ns);
        t["ring_full_ns"].push_back(op.ring_full_ns);
        t["capped_ns"].push_back(op.capped_ns);
      }
      j["rows"].back()["program_timeline_runs"].push_back(std::move(t));
    }
  }
  write_json_file(path, j);
}

void run(Options o) {
  // Every option checked before the GPU: a bad one is refused at once, not after a run.
  o.tps = unique_in_order(o.tps);
  o.ms = unique_in_order(o.ms);
  o.force = unique_in_order(o.force);
  for (int tp : o.tps) check(tp == 1 || tp == 2 || tp == 4 || tp == 8, "bench chain: --tp {} (1, 2, 4, 8)", tp);
  for (int m : o.ms) check(m >= 1 && m <= kGemmMaxRows, "bench chain: --m {} (1 .. {})", m, kGemmMaxRows);
  check(o.layers >= 1, "bench chain: --layers {}", o.layers);
  for (const std::string& name : o.force)
    check(valid_force(name), "bench chain: --force {} (warp or cublas)", name);
  check(!o.timeline || !o.norms, "bench chain: --timeline with --norms is not served (the norm ops have no MMAs)");
  check(!o.fold_norms || o.norms, "bench chain: --fold-norms needs --norms");
  const Gpu gpu = require_gpu("bench chain");
  cudaStream_t stream;
  TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  fmt::print(stderr, "bench chain: {} ({} SMs); measuring the read ceiling\n", gpu.name, gpu.sms);
  const bench::ReadCeiling ceiling = bench::measure_read_ceiling(std::size_t{4} << 30, 20, stream);
  std::vector<Row> rows;
  for (int tp : o.tps) {
    fmt::print(stderr, "TP {}: {} layers and the lm_head\n", tp, o.layers);
    bench_tp(tp, o, gpu, stream, rows);
  }
  TPD_CUDA(cudaStreamDestroy(stream));
  print_table(rows, ceiling, o);
  if (!o.json.empty()) write_json(o.json, rows, ceiling, gpu, o);
}

}  // namespace

void register_bench_chain(CLI::App& app) {
  CLI::App* cmd = bench_group(app)->add_subcommand(
      "chain", "the drafter's per-rank GEMM chain in one graph: cuBLAS vs DecodeGemm, % of the read ceiling");
  auto o = std::make_shared<Options>();
  cmd->add_option("--tp", o->tps, "TP shapes (repeatable; default 8 4 2 1)");
  cmd->add_option("--m", o->ms, "rows per call (repeatable; default 1 8 16 28)");
  cmd->add_option("--layers", o->layers, "draft layers in the chain")->capture_default_str();
  cmd->add_option("--replays", o->replays, "timed graph replays per measurement")
      ->capture_default_str()
      ->check(positive_count());
  cmd->add_option("--force", o->force,
                  "also time the chain with every link forced to: warp (the rule's split) or cublas (repeatable)");
  cmd->add_flag("--timeline", o->timeline,
               "the programs record where each op boundary's time goes (per CTA) and print it (0.3-2 % slower); "
               "--json then holds the program's per-CTA times too");
  cmd->add_flag("--silu-mul", o->silu_mul,
               "down reads silu(gate) * up of gate_up's out, as an MLP does: stock and ours run the drafter's "
               "SiLU-mul kernel between them, the programs run gate_up with the SiLU-mul epilogue");
  cmd->add_flag("--norms", o->norms,
               "the layers' TP 1 norms: q_a and kv after qkv_a, the residual add + RMSNorm after o_proj and down "
               "(the drafter's kernels between the GEMMs; Norm ops in the program)");
  cmd->add_flag("--fold-norms", o->fold_norms,
               "with --norms: the program folds each norm that a GEMM of it reads into that GEMM (GemmProgram::Norm::"
               "folded: no stage waits for the norm; the readers' bits differ by the roundings moved)");
  cmd->add_option("--json", o->json, "also write the rows as JSON to this file")->check(writable_file());
  cmd->callback([o] { run(*o); });
}

}  // namespace tpdecode::cli
