#include "core/launch.cuh"
#include "core/tensor_map.hpp"
#include "gemm/token_tiles.hpp"
#include "gemm/warp_splitk.cuh"

namespace tpdecode {
namespace {

// Calls f(kernel) for the (token tiles, row tiles) kernel: the wide CTA at every
// token tile count, the narrow ones (1 and 2 row tiles) at 1 and 2 (kWarpNarrowMaxRows).
template <class F>
void with_kernel(int token_tiles, int row_tiles, F&& f) {
  with_token_tiles(token_tiles, [&](auto tiles) {
    constexpr int kTiles = decltype(tiles)::value;
    if (row_tiles == kWarpWarps) {
      f(warp_splitk::warp_splitk_kernel<kTiles, kWarpWarps>);
      return;
    }
    if constexpr (8 * kTiles <= kWarpNarrowMaxRows) {
      if (row_tiles == 1) {
        f(warp_splitk::warp_splitk_kernel<kTiles, 1>);
        return;
      }
      if (row_tiles == 2) {
        f(warp_splitk::warp_splitk_kernel<kTiles, 2>);
        return;
      }
    }
    throw InvalidArgument("warp split-K: row tiles per CTA must be 4, or 2 or 1 up to 16 rows");
  });
}

}  // namespace

void prepare_warp_splitk(int token_tiles, int row_tiles) {
  with_kernel(token_tiles, row_tiles, [&](auto kernel) {
    TPD_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  warp_smem_bytes(token_tiles, row_tiles)));
  });
}

CUtensorMap narrow_x_map(const void* x, int m, int64_t k, int token_tiles) {
  // [k / 32 blocks][m][32] (the block dimension strides 64 bytes), in boxes
  // [4][8 token_tiles][32]: a chunk's [4 i, tokens, 4 t] pieces; rows past m zero.
  Bf16MapShape s;
  s.rank = 3;
  s.dims = {32, static_cast<uint64_t>(m), static_cast<uint64_t>(k / 32)};
  s.strides = {static_cast<uint64_t>(k) * 2, 64};
  s.box = {32, static_cast<uint32_t>(8 * token_tiles), static_cast<uint32_t>(kWarpChunkK / 32)};
  return encode_bf16_map(x, s, "warp split-K");
}

void launch_warp_splitk(const WarpSplitKParams& p, const GemmTactic& t, bool pdl, cudaStream_t stream) {
  LaunchShape s;
  s.grid = dim3(static_cast<unsigned>(t.split), static_cast<unsigned>(t.blocks));
  s.block = dim3(warp_splitk::kThreads);
  s.smem = static_cast<std::size_t>(warp_smem_bytes(t.token_tiles, t.row_tiles));
  s.cluster = t.split;
  s.pdl = pdl;
  const CUtensorMap x_map = t.row_tiles < kWarpWarps ? narrow_x_map(p.x, p.m, p.k, t.token_tiles) : CUtensorMap{};
  with_kernel(t.token_tiles, t.row_tiles, [&](auto kernel) { launch_kernel(kernel, s, stream, p, x_map); });
}

}  // namespace tpdecode
