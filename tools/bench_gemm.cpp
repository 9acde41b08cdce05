// tpdecode bench gemm: DecodeGemm against cuBLAS on the drafter's linears (DESIGN.md
// section 1, TP 8 and TP 1) and any --shape, for each M; CUDA graphs over rotating
// weight copies (>= 5 x L2, so every call reads HBM), median of many replays, and
// the HBM read ceiling measured in the same run.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_timing.hpp"
#include "commands.hpp"
#include "read_ceiling.hpp"
#include "tpdecode/decode_gemm.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/random_fill.hpp"

namespace tpdecode::cli {
namespace {

struct GemmShape {
  std::string set, name;
  int64_t n, k;
};

std::vector<GemmShape> reference_shapes(const std::string& set) {
  std::vector<GemmShape> s;
  if (set == "tp8" || set == "all")
    s.insert(s.end(), {{"tp8", "fused_qkv_a", 2112, 7168},
                       {"tp8", "q_b", 2304, 1536},
                       {"tp8", "o_proj", 7168, 1536},
                       {"tp8", "gate_up", 4608, 7168},
                       {"tp8", "down", 7168, 2304},
                       {"tp8", "lm_head", 20480, 7168},
                       {"tp8", "context", 896, 35840}});
  if (set == "tp1" || set == "all")
    s.insert(s.end(), {{"tp1", "fused_qkv_a", 2112, 7168},
                       {"tp1", "q_b", 18432, 1536},
                       {"tp1", "o_proj", 7168, 12288},
                       {"tp1", "gate_up", 36864, 7168},
                       {"tp1", "down", 7168, 18432},
                       {"tp1", "lm_head", 163840, 7168},
                       {"tp1", "context", 7168, 35840}});
  require(set == "tp8" || set == "tp1" || set == "all" || set == "none",
          fmt::format("bench gemm: --set {} (tp8, tp1, all, none)", set));
  return s;
}

GemmShape parse_shape(const std::string& text) {
  const auto x = text.find('x');
  require(x != std::string::npos, fmt::format("bench gemm: --shape {} is not NxK", text));
  GemmShape s{"custom", text, std::stoll(text.substr(0, x)), std::stoll(text.substr(x + 1))};
  require(s.n > 0 && s.k > 0, fmt::format("bench gemm: --shape {} must be positive", text));
  return s;
}

struct Options {
  std::string set = "all";
  std::vector<std::string> shapes;
  std::vector<int> ms = {1, 2, 4, 8, 16, 32, 64};
  int replays = 50;
  int split = 0;  // 0: the tactic rule
  std::string json;
};

struct Row {
  GemmShape shape;
  int m;
  GemmPath path;           // what DecodeGemm's default dispatch runs
  std::string tactic;
  double engine_us = 0;    // the engine, forced (0: it cannot run this row)
  double cublas_us = 0;
  double read_us = 0;      // a plain streaming read of the same weight copies
  double ours_us() const { return path == GemmPath::kWarpSplitK ? engine_us : cublas_us; }
};

struct Device {
  std::string name;
  int sms = 0;
  std::size_t l2 = 0;
};

Device device() {
  int d = 0;
  TPD_CUDA(cudaGetDevice(&d));
  cudaDeviceProp p{};
  TPD_CUDA(cudaGetDeviceProperties(&p, d));
  return {p.name, p.multiProcessorCount, static_cast<std::size_t>(p.l2CacheSize)};
}

double weight_bytes(const GemmShape& s) { return 2.0 * static_cast<double>(s.n) * static_cast<double>(s.k); }

// Times every M of one shape: ours (DecodeGemm) and cuBLAS over the same rotating copies.
void bench_shape(const GemmShape& s, const Options& o, const Device& dev, cudaStream_t stream,
                 std::vector<Row>& rows) {
  const std::size_t bytes = static_cast<std::size_t>(weight_bytes(s));
  // Why: copies totalling >= 5 x L2 so that no call finds its weight in L2.
  const int copies = static_cast<int>(std::max<std::size_t>(1, (5 * dev.l2 + bytes - 1) / bytes));
  const int calls = std::max(copies, 10);
  void* pool = nullptr;  // [copies, N, K] bf16
  TPD_CUDA(cudaMalloc(&pool, bytes * copies));
  std::unique_ptr<void, decltype(&cudaFree)> pool_guard(pool, &cudaFree);
  fill_uniform_bf16(pool, static_cast<int64_t>(bytes / 2) * copies, 42, 1.0f, stream);
  auto cublas = std::make_shared<CublasContext>();
  std::vector<std::unique_ptr<DecodeGemm>> gemms;  // one per copy
  for (int c = 0; c < copies; ++c) {
    gemms.push_back(
        std::make_unique<DecodeGemm>(TensorView::bf16(static_cast<char*>(pool) + bytes * c, s.n, s.k), cublas));
    gemms.back()->set_dispatch(GemmDispatch::kEngine);  // timed forced; the rule's path is reported
  }
  const int max_m = *std::max_element(o.ms.begin(), o.ms.end());
  void *x = nullptr, *out = nullptr;  // [max_m, K], [max_m, N] bf16
  TPD_CUDA(cudaMalloc(&x, static_cast<std::size_t>(max_m * s.k) * 2));
  std::unique_ptr<void, decltype(&cudaFree)> x_guard(x, &cudaFree);
  TPD_CUDA(cudaMalloc(&out, static_cast<std::size_t>(max_m * s.n) * 2));
  std::unique_ptr<void, decltype(&cudaFree)> out_guard(out, &cudaFree);
  fill_uniform_bf16(x, max_m * s.k, 7, 1.0f, stream);
  const double read_us = bench::time_streaming_read(pool, bytes, copies, calls, o.replays, stream);
  for (int m : o.ms) {
    const TensorView xv = TensorView::bf16(x, m, s.k);
    const TensorView ov = TensorView::bf16(out, m, s.n);
    const bool engine = gemms[0]->engine_eligible() && m <= kWarpMaxRows;
    for (auto& g : gemms) {
      if (engine && o.split) {
        try {
          g->set_split(m, o.split);
        } catch (const InvalidArgument&) {  // that split does not fit this K: the rule's tactic
        }
      }
      g->prepare(m, stream);
    }
    Row r{s, m, GemmPath::kCublas, ""};
    r.read_us = read_us;
    if (engine) {
      const GemmTactic& t = gemms[0]->tactic(m);
      r.path = t.engine_preferred ? GemmPath::kWarpSplitK : GemmPath::kCublas;
      r.tactic = t.describe();
      r.engine_us = bench::time_graph(stream, [&](cudaStream_t st, int c) { gemms[c % copies]->run(xv, ov, st); },
                                      calls, o.replays)
                        .median_us;
    }
    r.cublas_us = bench::time_graph(
                      stream,
                      [&](cudaStream_t st, int c) { cublas->gemm(xv, gemms[c % copies]->weight(), ov, st); }, calls,
                      o.replays)
                      .median_us;
    rows.push_back(r);
  }
}

double tbps(double bytes, double us) { return bytes / (us * 1e6); }

std::string us_or_dash(double us) { return us > 0 ? fmt::format("{:.2f}", us) : "-"; }

void print_table(const std::vector<Row>& rows, const bench::ReadCeiling& ceiling) {
  fmt::print("\n{:<5} {:<12} {:>6} {:>5} {:>7} {:>3} {:<6} {:>8} {:>8} {:>8} {:>5} {:>5} {:>5} {:>6} {:>6} {:>7} {:>5}  {}\n",
             "set", "linear", "N", "K", "MB", "M", "path", "ours us", "engine", "cuBLAS", "ratio", "TB/s", "%ceil",
             "engTB/s", "cuTB/s", "read us", "%read", "tactic");
  for (const Row& r : rows) {
    const double b = weight_bytes(r.shape);
    fmt::print("{:<5} {:<12} {:>6} {:>5} {:>7.1f} {:>3} {:<6} {:>8.2f} {:>8} {:>8.2f} {:>5.2f} {:>5.2f} {:>4.0f}% {:>6} "
               "{:>6.2f} {:>7.2f} {:>4.0f}%  {}\n",
               r.shape.set, r.shape.name, r.shape.n, r.shape.k, b / 1e6, r.m, gemm_path_name(r.path), r.ours_us(),
               us_or_dash(r.engine_us), r.cublas_us, r.cublas_us / r.ours_us(), tbps(b, r.ours_us()),
               100.0 * tbps(b, r.ours_us()) / ceiling.tb_per_s,
               r.engine_us > 0 ? fmt::format("{:.2f}", tbps(b, r.engine_us)) : "-", tbps(b, r.cublas_us), r.read_us,
               100.0 * r.read_us / r.ours_us(), r.tactic);
  }
  fmt::print("\nours = the default dispatch's path (engine where the tactic rule prefers it, else cuBLAS); engine = "
             "the engine forced; ratio = cuBLAS / ours; TB/s counts weight bytes once per call; read us = a plain "
             "streaming read of the same weight copies, %read = read us / ours us; read ceiling {:.2f} TB/s ({:.1f} GB streamed in {:.1f} us).\n",
             ceiling.tb_per_s, ceiling.bytes / 1e9, ceiling.median_us);
}

void write_json(const std::string& path, const std::vector<Row>& rows, const bench::ReadCeiling& ceiling,
                const Device& dev, const Options& o) {
  nlohmann::json j;
  j["device"] = {{"name", dev.name}, {"sms", dev.sms}, {"l2_bytes", dev.l2}};
  j["read_ceiling"] = {{"tb_per_s", ceiling.tb_per_s}, {"bytes", ceiling.bytes}, {"median_us", ceiling.median_us}};
  j["replays"] = o.replays;
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows) {
    const double b = weight_bytes(r.shape);
    j["rows"].push_back({{"set", r.shape.set},
                         {"linear", r.shape.name},
                         {"n", r.shape.n},
                         {"k", r.shape.k},
                         {"m", r.m},
                         {"path", gemm_path_name(r.path)},
                         {"tactic", r.tactic},
                         {"ours_us", r.ours_us()},
                         {"engine_us", r.engine_us},
                         {"cublas_us", r.cublas_us},
                         {"read_us", r.read_us},
                         {"ratio", r.cublas_us / r.ours_us()},
                         {"ours_tb_per_s", tbps(b, r.ours_us())},
                         {"engine_tb_per_s", r.engine_us > 0 ? tbps(b, r.engine_us) : 0.0},
                         {"cublas_tb_per_s", tbps(b, r.cublas_us)},
                         {"percent_of_ceiling", 100.0 * tbps(b, r.ours_us()) / ceiling.tb_per_s}});
  }
  std::ofstream(path) << j.dump(2) << "\n";
}

void run(const Options& o) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw Unavailable("bench gemm needs a CUDA GPU; none is visible here");
  }
  std::vector<GemmShape> shapes = reference_shapes(o.set);
  for (const std::string& t : o.shapes) shapes.push_back(parse_shape(t));
  require(!shapes.empty(), "bench gemm: no shapes (--set none without --shape)");
  for (int m : o.ms) require(m >= 1, fmt::format("bench gemm: --m {}", m));
  const Device dev = device();
  cudaStream_t stream;
  TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  fmt::print(stderr, "bench gemm: {} ({} SMs, L2 {} MB); measuring the read ceiling\n", dev.name, dev.sms,
             dev.l2 >> 20);
  const bench::ReadCeiling ceiling = bench::measure_read_ceiling(std::size_t{4} << 30, 20, stream);
  std::vector<Row> rows;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    fmt::print(stderr, "[{}/{}] {} {} {}x{}\n", i + 1, shapes.size(), shapes[i].set, shapes[i].name, shapes[i].n,
               shapes[i].k);
    bench_shape(shapes[i], o, dev, stream, rows);
  }
  TPD_CUDA(cudaStreamDestroy(stream));
  print_table(rows, ceiling);
  if (!o.json.empty()) write_json(o.json, rows, ceiling, dev, o);
}

}  // namespace

void register_bench_gemm(CLI::App& app) {
  CLI::App* cmd = bench_group(app)->add_subcommand("gemm", "DecodeGemm vs cuBLAS on the drafter's linears, per M");
  auto o = std::make_shared<Options>();
  cmd->add_option("--set", o->set, "reference shapes: tp8, tp1, all or none")->capture_default_str();
  cmd->add_option("--shape", o->shapes, "extra shape NxK (repeatable)");
  cmd->add_option("--m", o->ms, "rows per call (repeatable; default 1 2 4 8 16 32 64)");
  cmd->add_option("--replays", o->replays, "timed graph replays per measurement")->capture_default_str();
  cmd->add_option("--split", o->split, "force the engine's K split (1, 2, 4, 8) instead of the rule");
  cmd->add_option("--json", o->json, "also write the rows as JSON to this file");
  cmd->callback([o] { run(*o); });
}

}  // namespace tpdecode::cli
