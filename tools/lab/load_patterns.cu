// The load patterns of `tpdecode lab loads` (load_patterns.hpp):
//  - pieces: cp.async of 16 bytes per thread (evict-first, L2::256B), 4 warps, a
//    __syncthreads ring like the warp engine's; each warp instruction reads either
//    8 rows x 64 B or 2 rows x 256 B (the warp engine's mapping: 3-10 % faster per
//    GEMM, docs/history/performance-2026-11.md, "How the warp engine's weight copies
//    read memory");
//  - bulk rows: one producer warp, one cp.async.bulk per weight row and stage (the
//    pattern of a producer of per-row bulk copies), four consumer warps, full/empty mbarriers;
//  - tensor tiles: the same ring filled by cp.async.bulk.tensor.2d boxes of [64 rows,
//    64 columns] (128-byte swizzle) through a tensor map.
#include <cuda.h>

#include <cstdint>

#include "core/device.cuh"
#include "core/graph_timing.hpp"
#include "lab/load_patterns.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::lab {
namespace {

constexpr int kTileRows = 64;

struct Work {
  const uint16_t* w;  // [n, k] bf16
  int64_t k;
  int64_t chunks_per_tile;
  int64_t chunks;  // tiles x chunks_per_tile
  unsigned* sink;  // written only if the XOR of every word read is a magic value
};

__device__ __forceinline__ int64_t first_chunk(int64_t chunks, unsigned cta) { return chunks * cta / gridDim.x; }

enum class Rows { kEight, kTwo };  // rows per warp instruction: 8 x 64 B or 2 x 256 B

template <int kStages, int kCols, Rows kRows>
__global__ void __launch_bounds__(128) pieces_kernel(const Work a) {
  extern __shared__ __align__(1024) uint8_t smem[];
  constexpr int kStage = kTileRows * kCols * 2;
  constexpr int kPieces = kStage / 16 / 128;  // per thread and stage
  static_assert(kRows == Rows::kTwo || kCols == 128, "the 8-row mapping is the warp engine's 128-column chunk");
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int64_t begin = first_chunk(a.chunks, blockIdx.x);
  const int count = static_cast<int>(first_chunk(a.chunks, blockIdx.x + 1) - begin);
  const uint64_t policy = dev::evict_first_policy();
  auto where = [&](int i, int& row, int& col16) {  // thread's piece i of a stage
    if constexpr (kRows == Rows::kEight) {
      row = 16 * warp + lane / 4 + 8 * (i / 4);
      col16 = 4 * (i % 4) + lane % 4;
    } else {
      const int q = tid + 128 * i;
      row = q / (kCols / 8);
      col16 = q % (kCols / 8);
    }
  };
  auto issue = [&](int c) {
    const int64_t chunk = begin + c;
    const int64_t tile = chunk / a.chunks_per_tile;
    const int64_t col0 = (chunk % a.chunks_per_tile) * kCols;
    uint4* stage = reinterpret_cast<uint4*>(smem + (c % kStages) * kStage);
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      int row, col16;
      where(i, row, col16);
      dev::copy16_async(stage + row * (kCols / 8) + col16, a.w + (tile * kTileRows + row) * a.k + col0 + 8 * col16,
                        policy);
    }
  };
  unsigned acc = 0;
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) {
    if (c < count) issue(c);
    dev::copy_commit();
  }
  for (int c = 0; c < count; ++c) {
    __syncthreads();
    if (c + kStages - 1 < count) issue(c + kStages - 1);
    dev::copy_commit();
    dev::copy_wait<kStages - 1>();
    __syncthreads();
    const uint4* stage = reinterpret_cast<const uint4*>(smem + (c % kStages) * kStage);
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      int row, col16;
      where(i, row, col16);
      const uint4 v = stage[row * (kCols / 8) + col16];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  dev::copy_wait<0>();
  if (acc == 0x9e3779b9u) a.sink[blockIdx.x] = acc;
}

enum class Bulk { kRows, kTensorTiles };

template <int kStages, int kCols, Bulk kKind>
__global__ void __launch_bounds__(160) bulk_kernel(const Work a, const __grid_constant__ CUtensorMap map) {
  extern __shared__ __align__(1024) uint8_t smem[];
  constexpr int kStage = kTileRows * kCols * 2;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kStages;
  uint8_t* ring = smem + 1024;  // 1024-aligned: the 128-byte swizzle's period
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int warp = tid / 32;
  const int64_t begin = first_chunk(a.chunks, blockIdx.x);
  const int count = static_cast<int>(first_chunk(a.chunks, blockIdx.x + 1) - begin);
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      dev::mbar_init(full + s, 1);
      dev::mbar_init(empty + s, 4);
    }
    dev::mbar_init_fence();
  }
  __syncthreads();
  if (warp == 4) {  // the producer
    const uint64_t policy = dev::evict_first_policy();
    for (int c = 0; c < count; ++c) {
      const int slot = c % kStages;
      if (c >= kStages) dev::mbar_wait(empty + slot, static_cast<uint32_t>((c / kStages - 1) & 1));
      if (lane == 0) dev::mbar_arrive_expect_tx(full + slot, kStage);
      __syncwarp();
      const int64_t chunk = begin + c;
      const int64_t tile = chunk / a.chunks_per_tile;
      const int64_t col0 = (chunk % a.chunks_per_tile) * kCols;
      uint8_t* stage = ring + slot * kStage;
      if constexpr (kKind == Bulk::kRows) {
        for (int r = lane; r < kTileRows; r += 32)
          dev::bulk_copy_to_shared(stage + r * kCols * 2, a.w + (tile * kTileRows + r) * a.k + col0, kCols * 2,
                                   full + slot, policy);
      } else if (lane == 0) {
        for (int box = 0; box < kCols / 64; ++box)
          asm volatile(
              "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
              " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dev::shared_address(stage + box * kTileRows * 128)),
              "l"(reinterpret_cast<uint64_t>(&map)), "r"(static_cast<int>(col0 + 64 * box)),
              "r"(static_cast<int>(tile * kTileRows)), "r"(dev::shared_address(full + slot)), "l"(policy)
              : "memory");
      }
    }
    return;
  }
  unsigned acc = 0;
  for (int c = 0; c < count; ++c) {
    const int slot = c % kStages;
    dev::mbar_wait(full + slot, static_cast<uint32_t>((c / kStages) & 1));
    const uint4* stage = reinterpret_cast<const uint4*>(ring + slot * kStage);
    for (int q = lane; q < 16 * kCols / 8; q += 32) {  // this warp's quarter of the stage
      const uint4 v = stage[16 * warp * (kCols / 8) + q];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    __syncwarp();
    if (lane == 0) dev::mbar_arrive(empty + slot);
  }
  if (acc == 0x9e3779b9u) a.sink[blockIdx.x] = acc;
}

}  // namespace

std::vector<LoadTiming> time_load_patterns(const void* base, int64_t n, int64_t k,
                                           const std::vector<CUtensorMap>& maps, int calls, int replays, int sms,
                                           cudaStream_t stream) {
  const int copies = static_cast<int>(maps.size());
  const auto* w0 = static_cast<const uint16_t*>(base);
  auto weight = [&](int c) { return w0 + static_cast<int64_t>(c % copies) * n * k; };
  unsigned* sink = nullptr;
  TPD_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&sink), sizeof(unsigned) * 8 * sms, stream));
  std::vector<LoadTiming> out;
  auto work = [&](int c, int cols) { return Work{weight(c), k, k / cols, n / kTileRows * (k / cols), sink}; };
  // launch(stream, call, grid): one pass over copy call % copies.
  auto record = [&](const LoadPattern& p, const auto& launch) {
    const int grid = sms * p.ctas_per_sm;
    const GraphTiming t = time_graph(
        stream,
        [&](cudaStream_t s, int c) {
          launch(s, c, grid);
          TPD_CUDA(cudaGetLastError());
        },
        calls, replays);
    out.push_back({p, t.median_us});
  };
  auto pieces = [&](auto kernel, const char* name, int stages, int cols, int per_sm) {
    const int smem = stages * kTileRows * cols * 2;
    TPD_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    record({name, stages, cols, per_sm},
           [&](cudaStream_t s, int c, int grid) { kernel<<<grid, 128, smem, s>>>(work(c, cols)); });
  };
  auto bulk = [&](auto kernel, const char* name, int stages, int cols, int per_sm) {
    const int smem = 1024 + stages * kTileRows * cols * 2;
    TPD_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    record({name, stages, cols, per_sm}, [&](cudaStream_t s, int c, int grid) {
      kernel<<<grid, 160, smem, s>>>(work(c, cols), maps[static_cast<std::size_t>(c % copies)]);
    });
  };
  pieces(pieces_kernel<4, 128, Rows::kEight>, "cp.async 8 rows x 64 B", 4, 128, 3);
  pieces(pieces_kernel<4, 128, Rows::kTwo>, "cp.async 2 rows x 256 B", 4, 128, 3);
  pieces(pieces_kernel<4, 256, Rows::kTwo>, "cp.async 2 rows x 256 B", 4, 256, 1);
  bulk(bulk_kernel<4, 128, Bulk::kRows>, "bulk copy per row", 4, 128, 3);
  bulk(bulk_kernel<4, 256, Bulk::kRows>, "bulk copy per row", 4, 256, 1);
  bulk(bulk_kernel<3, 512, Bulk::kRows>, "bulk copy per row", 3, 512, 1);
  bulk(bulk_kernel<4, 128, Bulk::kTensorTiles>, "tensor tiles 64 x 64", 4, 128, 3);
  bulk(bulk_kernel<4, 256, Bulk::kTensorTiles>, "tensor tiles 64 x 64", 4, 256, 1);
  bulk(bulk_kernel<3, 512, Bulk::kTensorTiles>, "tensor tiles 64 x 64", 3, 512, 1);
  TPD_CUDA(cudaFreeAsync(sink, stream));
  return out;
}

}  // namespace tpdecode::lab
