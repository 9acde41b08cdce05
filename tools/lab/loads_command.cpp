// tpdecode lab loads: how fast a weight streams into shared memory by each load
// pattern a decode GEMM engine could use (load_patterns.hpp), against a plain
// streaming read of the same weight copies. What an engine's loads allow, before
// any arithmetic: the warp engine's copy mapping was chosen from this table. A lab
// instrument for engine design, not a benchmark of the library.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/check.hpp"
#include "core/graph_timing.hpp"
#include "core/random_fill.hpp"
#include "core/weight_rotation.hpp"
#include "gemm_shapes.hpp"
#include "json_file.hpp"
#include "lab/load_patterns.hpp"
#include "read_ceiling.hpp"
#include "tpdecode/device_buffer.hpp"

namespace tpdecode::lab {

CUtensorMap weight_tiles_map(const void* w, int64_t n, int64_t k) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  TPD_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status));
  check<Error>(status == cudaDriverEntryPointSuccess && fn != nullptr,
               "lab loads: the driver has no cuTensorMapEncodeTiled");
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(n)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k * 2)};
  const cuuint32_t box[2] = {64, 64};
  const cuuint32_t element_strides[2] = {1, 1};
  CUtensorMap map{};
  const CUresult r = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(w), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  check<Error>(r == CUDA_SUCCESS, "lab loads: cuTensorMapEncodeTiled failed ({})", static_cast<int>(r));
  return map;
}

}  // namespace tpdecode::lab

namespace tpdecode::cli {
namespace {

struct Options {
  std::vector<std::string> shapes = {"12416x7168", "7168x12288", "16896x7168", "4608x7168"};
  int replays = 20;
  std::string json;
};

void run(const Options& o) {
  for (const std::string& text : o.shapes) {  // all before the GPU: one bad shape refuses the run at once
    const GemmShape s = parse_shape(text);
    check<InvalidArgument>(s.n % 64 == 0 && s.k % 512 == 0, "lab loads: {} (N a multiple of 64, K of 512)", text);
  }
  const Gpu gpu = require_gpu("lab loads");
  cudaStream_t stream = nullptr;
  TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  nlohmann::json j;
  j["gpu"] = {{"name", gpu.name}, {"sms", gpu.sms}, {"l2_bytes", gpu.l2}};
  for (const std::string& text : o.shapes) {
    const GemmShape s = parse_shape(text);
    const auto bytes = static_cast<std::size_t>(s.bytes());
    const int copies = weight_copies(bytes, gpu.l2);  // every pass reads HBM (weight_rotation.hpp)
    const int calls = std::max(copies, 10);
    DeviceBuffer pool(bytes * static_cast<std::size_t>(copies));
    fill_uniform_bf16(pool.get(), static_cast<int64_t>(bytes / 2) * copies, 42, 1.0f, stream);
    std::vector<CUtensorMap> maps;
    for (int c = 0; c < copies; ++c)
      maps.push_back(lab::weight_tiles_map(pool.as<char>() + bytes * static_cast<std::size_t>(c), s.n, s.k));
    const double read_us = bench::time_streaming_read(pool.get(), bytes, copies, calls, o.replays, stream);
    const auto rows = lab::time_load_patterns(pool.get(), s.n, s.k, maps, calls, o.replays, gpu.sms, stream);
    fmt::print("\n{}x{} ({:.1f} MB, {} copies): plain streaming read {:.2f} us ({:.2f} TB/s)\n", s.n, s.k, bytes / 1e6,
               copies, read_us, bytes / read_us / 1e6);
    fmt::print("{:<26} {:>6} {:>7} {:>8} {:>9} {:>6} {:>6}\n", "pattern", "stages", "columns", "CTAs/SM", "us", "TB/s",
               "%read");
    nlohmann::json shape = {{"n", s.n}, {"k", s.k}, {"read_us", read_us}, {"patterns", nlohmann::json::array()}};
    for (const auto& r : rows) {
      fmt::print("{:<26} {:>6} {:>7} {:>8} {:>9.2f} {:>6.2f} {:>5.1f}%\n", r.pattern.name, r.pattern.stages,
                 r.pattern.cols, r.pattern.ctas_per_sm, r.us, bytes / r.us / 1e6, 100.0 * read_us / r.us);
      shape["patterns"].push_back({{"pattern", r.pattern.name},
                                   {"stages", r.pattern.stages},
                                   {"columns", r.pattern.cols},
                                   {"ctas_per_sm", r.pattern.ctas_per_sm},
                                   {"us", r.us},
                                   {"percent_of_read", 100.0 * read_us / r.us}});
    }
    j["shapes"].push_back(shape);
  }
  TPD_CUDA(cudaStreamDestroy(stream));
  fmt::print(
      "\nEach pattern streams the weight into shared memory in 64-row tiles x K chunks, every CTA the same "
      "number of chunks, and only reads it back (no arithmetic); %read = a plain streaming read of the same "
      "copies / the pattern. Medians of CUDA graph replays.\n");
  if (!o.json.empty()) write_json_file(o.json, j);
}

}  // namespace

void register_lab_loads(CLI::App& app) {
  CLI::App* cmd = lab_group(app)->add_subcommand(
      "loads", "how fast each load pattern streams a weight into shared memory, against a plain read");
  auto o = std::make_shared<Options>();
  cmd->add_option("--shape", o->shapes, "weight NxK, N a multiple of 64, K of 512 (repeatable)")->capture_default_str();
  cmd->add_option("--replays", o->replays, "timed graph replays per measurement")
      ->capture_default_str()
      ->check(positive_count());
  cmd->add_option("--json", o->json, "also write the table as JSON to this file")->check(writable_file());
  cmd->callback([o] { run(*o); });
}

}  // namespace tpdecode::cli
