// tpdecode lab launches: DecodeGemm's candidates for one shape and row count, each
// forced and launched eagerly a few times over rotating weight copies, one event
// pair around each candidate's launches. What a profiler (ncu, compute-sanitizer)
// needs to see each tactic's kernel alone, outside graphs and the tuner; the times
// printed are eager launches, not the benchmarks' graph replays. A lab instrument
// for engine design, not a benchmark of the library.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/check.hpp"
#include "core/random_fill.hpp"
#include "core/weight_rotation.hpp"
#include "gemm_shapes.hpp"
#include "tpdecode/decode_gemm.hpp"
#include "tpdecode/device_buffer.hpp"

namespace tpdecode::cli {
namespace {

struct Options {
  std::string shape = "20480x7168";
  int m = 64;
  std::vector<std::string> match;  // run the candidates whose description holds one of these (none: all)
  int calls = 2;
};

bool selected(const Options& o, const std::string& tactic) {
  if (o.match.empty()) return true;
  for (const std::string& s : o.match)
    if (tactic.find(s) != std::string::npos) return true;
  return false;
}

void run(const Options& o) {
  const GemmShape s = parse_shape(o.shape);
  check<InvalidArgument>(o.m >= 1 && o.m <= kGemmMaxRows, "lab launches: --m {} (1 .. {})", o.m, kGemmMaxRows);
  const Gpu gpu = require_gpu("lab launches");
  cudaStream_t stream = nullptr;
  TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto bytes = static_cast<std::size_t>(s.bytes());
  const int copies = weight_copies(bytes, gpu.l2);
  DeviceBuffer pool(bytes * static_cast<std::size_t>(copies));  // [copies, N, K] bf16
  fill_uniform_bf16(pool.get(), static_cast<int64_t>(bytes / 2) * copies, 42, 1.0f, stream);
  DeviceBuffer x(static_cast<std::size_t>(o.m * s.k) * 2);    // [m, K] bf16
  DeviceBuffer out(static_cast<std::size_t>(o.m * s.n) * 2);  // [m, N] bf16
  fill_uniform_bf16(x.get(), o.m * s.k, 7, 1.0f, stream);
  auto cublas = std::make_shared<CublasContext>();
  std::vector<std::unique_ptr<DecodeGemm>> gemms;
  for (int c = 0; c < copies; ++c)
    gemms.push_back(std::make_unique<DecodeGemm>(
        TensorView::bf16(pool.as<char>() + bytes * static_cast<std::size_t>(c), s.n, s.k), cublas));
  const TensorView xv = TensorView::bf16(x.get(), o.m, s.k);
  const TensorView ov = TensorView::bf16(out.get(), o.m, s.n);
  cudaEvent_t start = nullptr, stop = nullptr;
  TPD_CUDA(cudaEventCreate(&start));
  TPD_CUDA(cudaEventCreate(&stop));
  fmt::print("{} ({:.1f} MB, {} copies), M {}: {} launches per candidate\n", o.shape, bytes / 1e6, copies, o.m,
             o.calls);
  int call = 0, ran = 0;
  // Why the bucket's largest row count: force() checks a decision there (as the tuner times it).
  for (const GemmDecision& d : gemms[0]->candidates(gemm_bucket_max(gemm_m_bucket(o.m)))) {
    const std::string tactic = tactic_of(d, s.n, s.k, o.m);
    if (!selected(o, tactic)) continue;
    for (auto& g : gemms) g->force(o.m, d);
    TPD_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < o.calls; ++i) gemms[call++ % copies]->run(xv, ov, stream);
    TPD_CUDA(cudaEventRecord(stop, stream));
    TPD_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    TPD_CUDA(cudaEventElapsedTime(&ms, start, stop));
    fmt::print("  {:>9.2f} us/launch  {}\n", 1e3 * ms / o.calls, tactic);
    ++ran;
  }
  if (ran == 0) fmt::print("  no candidate matched --match\n");
  TPD_CUDA(cudaEventDestroy(start));
  TPD_CUDA(cudaEventDestroy(stop));
  TPD_CUDA(cudaStreamDestroy(stream));
}

}  // namespace

void register_lab_launches(CLI::App& app) {
  CLI::App* cmd = lab_group(app)->add_subcommand(
      "launches", "each DecodeGemm candidate forced and launched eagerly (for a profiler), one shape and M");
  auto o = std::make_shared<Options>();
  cmd->add_option("--shape", o->shape, "weight NxK")->capture_default_str();
  cmd->add_option("--m", o->m, "activation rows (1 .. 64)")->capture_default_str();
  cmd->add_option("--match", o->match, "only candidates whose description holds this text (repeatable)");
  cmd->add_option("--calls", o->calls, "eager launches per candidate")->capture_default_str()->check(positive_count());
  cmd->callback([o] { run(*o); });
}

}  // namespace tpdecode::cli
