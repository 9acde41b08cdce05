#include "gemm/gemm_paths.hpp"

#include <atomic>

#include "gemm/warp_splitk_launch.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

// Kernel attributes are per device: bit d is set once the engine's attributes are
// set on device d (two threads may both set them: harmless).
std::atomic<uint64_t> warp_devices{0};

uint64_t device_bit() {
  int device = 0;
  TPD_CUDA(cudaGetDevice(&device));
  return uint64_t{1} << (device % 64);
}

}  // namespace

void prepare_path(const GemmDecision& d, const TensorView& weight, int m, int sms, CublasContext& ctx) {
  if (d.path == GemmPath::kWarpSplitK && !(warp_devices.load() & device_bit())) {
    for (int tiles : {1, 2, 4}) prepare_warp_splitk(tiles);
    warp_devices.fetch_or(device_bit());
  }
}

bool path_prepared(const GemmDecision& d, const TensorView& weight, int m, int sms, CublasContext& ctx) {
  switch (d.path) {
    case GemmPath::kWarpSplitK: return (warp_devices.load() & device_bit()) != 0;
    case GemmPath::kCublas:
    case GemmPath::kCublasLt: return true;
  }
  return false;
}

void launch_path(const GemmDecision& d, const TensorView& weight, const TensorView& x, const TensorView& out, int sms,
                 CublasContext& ctx, bool pdl, cudaStream_t stream) {
  const int m = static_cast<int>(x.rows);
  switch (d.path) {
    case GemmPath::kWarpSplitK: {
      const WarpSplitKParams p{.w = weight.data,
                               .x = x.data,
                               .out = out.data,
                               .m = m,
                               .chunks = static_cast<int>(weight.cols / kWarpChunkK),
                               .n = weight.rows,
                               .k = weight.cols,
                               .out_stride = out.row_stride};
      launch_warp_splitk(p, tactic_with_split(weight.rows, weight.cols, m, sms, d.split), pdl, stream);
      return;
    }
    case GemmPath::kCublasLt: ctx.gemm_lt(x, weight, out, d.lt_algo, stream); return;
    case GemmPath::kCublas: break;
  }
  ctx.gemm(x, weight, out, stream);
}

}  // namespace tpdecode
