#include "gemm/gemm_paths.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "core/device_set.hpp"
#include "gemm/warp_splitk_launch.hpp"
#include "gemm/wgmma_launch.hpp"
#include "gemm/wgmma_plan.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

// The devices the warp engine's kernel attributes are set on.
DeviceSet warp_devices;

}  // namespace

CUtensorMap warp_tensor_map_of(const TensorView& weight) {
  return wgmma_tile_map(weight.data, weight.rows, weight.cols, 16, 2);
}

WgmmaShape wgmma_shape_of(const GemmDecision& d, int m) {
  const bool wide = d.path == GemmPath::kWgmmaWide;
  return {.sub_tiles = d.sub_tiles,
          .tokens = wide ? wgmma::kMaxTokens : wgmma::token_tile(m),
          .split = d.split,
          .clusters = d.clusters,
          .stages = d.stages,
          .wide = wide};
}

GemmDecision prepare_path(const GemmDecision& d, const TensorView& weight, int m) {
  if (d.path == GemmPath::kWarpSplitK && !warp_devices.has_current()) {
    for (int row_tiles : kWarpRowTileChoices)
      for (int tiles : {1, 2, 4, 8})
        if (warp_row_tiles_ok(row_tiles, 8 * tiles)) {
          prepare_warp_splitk(tiles, row_tiles);
          if (row_tiles == 1) prepare_warp_splitk(tiles, row_tiles, true);
        }
    warp_devices.add_current();
  }
  if (!wgmma_path(d.path)) return d;
  prepare_wgmma();
  if (d.clusters > 0) return d;
  const WgmmaShape s = wgmma_shape_of(d, m);
  const int64_t blocks = (weight.rows + s.rows() - 1) / s.rows();
  const int resident = wgmma_resident_clusters(s);
  check(resident > 0, "decode_gemm: {} does not fit this GPU", describe(d));
  GemmDecision launched = d;
  launched.clusters = static_cast<uint16_t>(std::min<int64_t>({blocks, resident, 65535}));
  return launched;
}

bool path_prepared(const GemmDecision& d) {
  switch (d.path) {
    case GemmPath::kWarpSplitK: return warp_devices.has_current();
    case GemmPath::kWgmma:
    case GemmPath::kWgmmaWide: return d.clusters > 0 && wgmma_prepared();
    case GemmPath::kCublas:
    case GemmPath::kCublasLt: return true;
  }
  return false;
}

void launch_path(const GemmDecision& d, const TensorView& weight, const TensorView& x, const TensorView& out,
                 CublasContext& ctx, bool pdl, cudaStream_t stream, const CUtensorMap* w_map) {
  const int m = static_cast<int>(x.rows);
  switch (d.path) {
    case GemmPath::kWarpSplitK: {
      // x is contiguous (engine_activations_ok): rows [first, first + rows) start at first * K.
      const int per_launch = warp_launch_rows(d.sub_tiles, m);
      const bool tensor_map = warp_tensor_map(d);
      const CUtensorMap made = tensor_map && !w_map ? warp_tensor_map_of(weight) : CUtensorMap{};
      for (int first = 0; first < m; first += per_launch) {
        const int rows = std::min(per_launch, m - first);
        const WarpSplitKParams p{.w = weight.data,
                                 .x = static_cast<const uint16_t*>(x.data) + first * weight.cols,
                                 .out = static_cast<uint16_t*>(out.data) + first * out.row_stride,
                                 .m = rows,
                                 .chunks = static_cast<int>(weight.cols / kWarpChunkK),
                                 .n = weight.rows,
                                 .k = weight.cols,
                                 .out_stride = out.row_stride};
        launch_warp_splitk(p, warp_launch_tactic(weight.rows, weight.cols, rows, d.split, d.sub_tiles, tensor_map),
                           pdl, stream, tensor_map ? (w_map ? w_map : &made) : nullptr);
      }
      return;
    }
    case GemmPath::kWgmma:
    case GemmPath::kWgmmaWide: {
      const WgmmaShape s = wgmma_shape_of(d, m);
      const int rows = s.rows();
      const WgmmaParams p{.x = x.data,
                          .out = out.data,
                          .m = m,
                          .n = weight.rows,
                          .k = weight.cols,
                          .out_stride = out.row_stride,
                          .blocks = (weight.rows + rows - 1) / rows,
                          .chunks = static_cast<int>(weight.cols / wgmma::kChunkK)};
      if (w_map) {
        launch_wgmma(*w_map, p, s, pdl, stream);
      } else {
        const CUtensorMap map = wgmma_tile_map(weight.data, weight.rows, weight.cols, rows);
        launch_wgmma(map, p, s, pdl, stream);
      }
      return;
    }
    case GemmPath::kCublasLt: ctx.gemm_lt(x, weight, out, d.lt_algo, stream); return;
    case GemmPath::kCublas: break;
  }
  ctx.gemm(x, weight, out, stream);
}

}  // namespace tpdecode
