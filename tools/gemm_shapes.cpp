#include "gemm_shapes.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <charconv>
#include <string_view>

#include "core/check.hpp"
#include "tpdecode/cublas_context.hpp"

namespace tpdecode::cli {

std::vector<GemmShape> drafter_shapes(int tp) {
  check(tp == 1 || tp == 2 || tp == 4 || tp == 8, "drafter shapes: TP {} (1, 2, 4, 8)", tp);
  const std::string set = fmt::format("tp{}", tp);
  return {{set, "fused_qkv_a", 2112, 7168},     {set, "q_b", 18432 / tp, 1536},
          {set, "o_proj", 7168, 12288 / tp},    {set, "gate_up", 36864 / tp, 7168},
          {set, "down", 7168, 18432 / tp},      {set, "lm_head", 163840 / tp, 7168},
          {set, "context", 7168 / tp, 35840}};
}

std::vector<GemmShape> layer_shapes(int tp) {
  std::vector<GemmShape> s = drafter_shapes(tp);
  s.resize(5);
  return s;
}

std::vector<GemmShape> mid_shapes() {
  return {{"mid", "1152x1536", 1152, 1536},    {"mid", "7168x3072", 7168, 3072},
          {"mid", "6288x7168", 6288, 7168},    {"mid", "10240x7168", 10240, 7168},
          {"mid", "12448x7168", 12448, 7168},  {"mid", "7168x8448", 7168, 8448},
          {"mid", "7168x14336", 7168, 14336},  {"mid", "16896x7168", 16896, 7168},
          {"mid", "40960x7168", 40960, 7168}};
}

GemmShape parse_shape(const std::string& text) {
  // Why from_chars over the whole text: stoll would take "12x34x56" as 12x34.
  const auto whole = [](std::string_view t, int64_t& v) {
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    return !t.empty() && ec == std::errc() && end == t.data() + t.size();
  };
  const std::string_view t(text);
  const auto x = t.find('x');
  GemmShape s{"custom", text, 0, 0};
  check(x != std::string_view::npos && whole(t.substr(0, x), s.n) && whole(t.substr(x + 1), s.k),
        "--shape {}: NxK, two integers (e.g. 2112x7168)", text);
  check(s.n > 0 && s.k > 0 && s.n <= kMaxShapeSide && s.k <= kMaxShapeSide && s.n * s.k <= kMaxShapeElements,
        "--shape {}: N and K from 1 to {}, N x K at most {} elements", text, kMaxShapeSide, kMaxShapeElements);
  return s;
}

Gpu require_gpu(const char* command) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw Unavailable(fmt::format("{} needs a CUDA GPU; none is visible here", command));
  }
  int d = 0;
  TPD_CUDA(cudaGetDevice(&d));
  cudaDeviceProp p{};
  TPD_CUDA(cudaGetDeviceProperties(&p, d));
  return {p.name, p.multiProcessorCount, static_cast<std::size_t>(p.l2CacheSize)};
}

std::string tactic_of(const GemmDecision& d, int64_t n, int64_t k, int m) {
  switch (d.path) {
    case GemmPath::kWarpSplitK: {
      const int rows = warp_launch_rows(d.sub_tiles, m);
      const std::string launches = rows < m ? fmt::format(", {} launches", (m + rows - 1) / rows) : "";
      const GemmTactic t = warp_launch_tactic(n, k, rows, d.split, d.sub_tiles, warp_tensor_map(d));
      return fmt::format("warp {}{}", t.describe(), launches);
    }
    case GemmPath::kWgmma:
    case GemmPath::kWgmmaWide: return describe(d);
    case GemmPath::kCublasLt: return fmt::format("cublaslt {}", CublasContext::describe_lt(d.lt_algo));
    case GemmPath::kCublas: break;
  }
  return "cublas default";
}

}  // namespace tpdecode::cli
