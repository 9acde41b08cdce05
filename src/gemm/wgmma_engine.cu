// The wgmma engine's kernel (a loop over the units wgmma_tiles.cuh streams) and its
// host side: the weight's tensor map, kernel attributes, residency, the launch.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <string>

#include "core/device_set.hpp"
#include "gemm/gemm_tactic.hpp"
#include "gemm/wgmma_launch.hpp"
#include "gemm/wgmma_tiles.cuh"
#include "tpdecode/error.hpp"

namespace tpdecode {
namespace wgmma {
namespace {

// Cluster g's row blocks g, g + clusters, ...; this CTA's K range of each (in
// chunks: the ring's depth is 1). One weight and one x for every unit, ready once
// the previous kernel is.
struct ClusterSchedule {
  int64_t first;
  int64_t step;
  int64_t blocks;
  int rows_per_block;
  int chunk_begin;
  int chunk_end;
  const CUtensorMap* w;
  const CUtensorMap* x;
  __device__ int count() const { return first < blocks ? static_cast<int>((blocks - first + step - 1) / step) : 0; }
  __device__ Unit unit(int i) const { return {(first + i * step) * rows_per_block, chunk_begin, chunk_end}; }
  __device__ void load_weights(int i, int chunk, uint8_t* smem, uint64_t* bar, uint64_t policy) const {
    dev::tma_load_2d(smem, w, chunk * kChunkK, static_cast<int>(unit(i).row0), bar, policy);
  }
  __device__ const CUtensorMap* activation_map(int) const { return x; }
  __device__ void await_inputs(int) const {}
};

// What every engine kernel does around its consumers: the ring (kWRows weight rows,
// one block, and kXRows activation rows per stage) and the partials of layout `l`,
// the producers' roles, and the consumer warpgroup's start after the previous
// kernel; then consume(ring, partials, schedule, cursor, out) runs the consumers'
// units.
template <int kWRows, int kXRows, class Consume>
__device__ __forceinline__ void run_engine(const CUtensorMap& w_map, const CUtensorMap& x_map, const WgmmaParams& p,
                                           const Layout& l, Consume&& consume) {
  // Why at entry: the next kernel may launch now and prefetch its weights during
  // this one's tail; it reads this kernel's output only after its own
  // griddepcontrol.wait, which waits for all of this grid.
  dev::pdl_launch_dependents();
  // Why before the barriers' initialisation: the first weight copy needs the map.
  if (threadIdx.x == kWeightWarp * 32)
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&w_map)) : "memory");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + kAlign - 1) & ~uintptr_t{kAlign - 1});
  auto* bars = reinterpret_cast<uint64_t*>(base + l.barriers_offset);
  const Ring<kWRows, kXRows> ring{base, l.stages, bars, bars + l.stages};
  const int split = static_cast<int>(gridDim.x);
  const Partials partials{reinterpret_cast<float*>(base + l.partials_offset),
                          l.partial_bytes / 4,
                          l.partial_stride,
                          bars + 2 * l.stages,
                          bars + 2 * l.stages + 2,
                          split,
                          static_cast<int>(blockIdx.x)};
  const int rank = static_cast<int>(blockIdx.x);
  const ClusterSchedule schedule{static_cast<int64_t>(blockIdx.y),
                                 static_cast<int64_t>(gridDim.y),
                                 p.blocks,
                                 kWRows,
                                 static_cast<int>(static_cast<int64_t>(p.chunks) * rank / split),
                                 static_cast<int>(static_cast<int64_t>(p.chunks) * (rank + 1) / split),
                                 &w_map,
                                 &x_map};
  // Why no zeroing of the activation rows past m: the box brings them as zeros, and
  // an output column depends on its own token's row alone.
  init_barriers(ring, partials);
  __syncthreads();
  // Why a cluster barrier's arrival here and its wait only in the consumers, before
  // their first arrival on a peer's barrier: the producers touch this CTA's
  // barriers alone, so their first weight copies need not wait for the cluster. Why
  // relaxed: fence.mbarrier_init already released the initialisations to the
  // cluster, and a release arrival measured ~2.5 us while another CTA on the SM
  // streamed (docs/performance.md).
  dev::cluster_arrive_relaxed();

  const int warp = static_cast<int>(threadIdx.x) / 32;
  Cursor cur;
  if (warp == kWeightWarp) {
    if (threadIdx.x % 32 == 0) produce_weights(ring, schedule, cur);
    return;
  }
  if (warp == kActivationWarp) {
    if (threadIdx.x % 32 == 0) {
      dev::pdl_wait();
      produce_activations(ring, schedule, cur);
    }
    return;
  }
  // Why: the previous kernel may still read the buffer this one writes.
  dev::pdl_wait();
  cuda::ptx::barrier_cluster_wait();
  consume(ring, partials, schedule, cur, static_cast<__nv_bfloat16*>(p.out));
}

// One unit's outputs: out[token, row0 + row] for the first m tokens and the
// weight's rows, rounded to BF16 once.
struct UnitOutputs {
  __nv_bfloat16* out;
  int64_t stride;
  int64_t n;
  int64_t row0;
  __device__ void operator()(int token, int row, float v) const {
    const int64_t column = row0 + row;
    if (column < n) out[token * stride + column] = __float2bfloat16_rn(v);
  }
};

// The weight as A. A CTA alone writes its outputs from its accumulators (store_unit);
// a split sums its partials over the cluster (reduce_unit).
template <int kSub, int kTokens>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_gemm_kernel(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map,
                      const WgmmaParams p, const int stages) {
  run_engine<kSub * kTileRows, kTokens>(w_map, x_map, p, layout(kSub, kTokens, stages),
                            [&](const auto& ring, const Partials& partials, const ClusterSchedule& schedule,
                                Cursor& cur, __nv_bfloat16* out) {
                              float acc[kChains][kSub][kTokens / 2];
                              const int units = schedule.count();
                              for (int j = 0; j < units; ++j) {
                                const Unit u = schedule.unit(j);
                                multiply_unit(ring, u, cur, acc);
                                const UnitOutputs to{out, p.out_stride, p.n, u.row0};
                                if (partials.split == 1)
                                  store_unit<kSub, kTokens>(acc[0], p.m, to);
                                else
                                  reduce_unit<kSub, kTokens>(partials, j, acc[0], p.m, to);
                              }
                              drain_partials(partials, units);
                            });
}

// The wide form (wgmma_plan.hpp): the weight tile as B, the activations padded to
// 64 rows as A. As the weight-as-A kernel, a CTA alone stores and a split reduces
// (its partials compiled where its ring fits beside them).
template <int kRows>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_wide_kernel(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map,
                      const WgmmaParams p, const int stages) {
  constexpr bool kSplits = wide_stages_within(kRows, 2, kSmemPerCtaMax) > 0;
  run_engine<kRows, kTileRows>(
      w_map, x_map, p, wide_layout(kRows, stages, static_cast<int>(gridDim.x)),
      [&](const auto& ring, const Partials& partials, const ClusterSchedule& schedule, Cursor& cur,
          __nv_bfloat16* out) {
        float acc[kRows / 2];
        const int units = schedule.count();
        for (int j = 0; j < units; ++j) {
          const Unit u = schedule.unit(j);
          multiply_unit_wide(ring, u, cur, acc);
          const UnitOutputs to{out, p.out_stride, p.n, u.row0};
          if (kSplits && partials.split > 1)
            reduce_unit_wide<kRows, kMaxTokens>(partials, j, acc, p.m, to);
          else
            store_unit_wide<kRows>(acc, p.m, to);
        }
        if (kSplits && partials.split > 1) drain_partials(partials, units);
      });
}

// The weight-as-A kernels built: (sub_tiles, tokens); a launch of another shape is
// refused.
template <class F>
bool with_kernel(int sub_tiles, int tokens, F&& f) {
  auto pick = [&](auto sub) {
    constexpr int kSub = decltype(sub)::value;
    auto built = [&](auto tok) {
      constexpr int kTokens = decltype(tok)::value;
      if constexpr (shape_built(kSub, kTokens)) {
        f(wgmma_gemm_kernel<kSub, kTokens>);
        return true;
      }
      return false;
    };
    switch (tokens) {
      case 8: return built(std::integral_constant<int, 8>{});
      case 16: return built(std::integral_constant<int, 16>{});
      case 32: return built(std::integral_constant<int, 32>{});
      case 64: return built(std::integral_constant<int, 64>{});
      default: return false;
    }
  };
  switch (sub_tiles) {
    case 1: return pick(std::integral_constant<int, 1>{});
    case 2: return pick(std::integral_constant<int, 2>{});
    case 4: return pick(std::integral_constant<int, 4>{});
    default: return false;
  }
}

// The wide kernels built: one per block size of kWideRows.
template <class F>
bool with_wide_kernel(int rows, F&& f) {
  switch (rows) {
    case 128: return f(wgmma_wide_kernel<128>), true;
    case 160: return f(wgmma_wide_kernel<160>), true;
    case 192: return f(wgmma_wide_kernel<192>), true;
    case 224: return f(wgmma_wide_kernel<224>), true;
    case 256: return f(wgmma_wide_kernel<256>), true;
    default: return false;
  }
}

// The kernel of a launch shape (either form).
template <class F>
bool with_shape_kernel(const WgmmaShape& s, F&& f) {
  return s.wide ? with_wide_kernel(s.rows(), f) : with_kernel(s.sub_tiles, s.tokens, f);
}

Layout layout_of(const WgmmaShape& s) {
  return s.wide ? wide_layout(s.rows(), s.stages, s.split) : layout(s.sub_tiles, s.tokens, s.stages);
}

cudaLaunchConfig_t config_of(const WgmmaShape& s, cudaLaunchAttribute (&attrs)[2], bool pdl, cudaStream_t stream) {
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(static_cast<unsigned>(s.split), static_cast<unsigned>(s.clusters));
  c.blockDim = dim3(kThreads);
  c.dynamicSmemBytes = static_cast<std::size_t>(layout_of(s).smem_bytes);
  c.stream = stream;
  // Why a cluster attribute even for split 1: the kernel addresses its partials and
  // barriers as the cluster's (a cluster of one).
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = static_cast<unsigned>(s.split);
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  unsigned n = 1;
  if (pdl) {
    attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[1].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  c.attrs = attrs;
  c.numAttrs = n;
  return c;
}

DeviceSet prepared_devices;  // where the kernels' shared-memory limit is raised

}  // namespace
}  // namespace wgmma

CUtensorMap wgmma_tile_map(const void* w, int64_t n, int64_t k, int box_rows, int depth, int64_t row_stride) {
  using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const EncodeTiled encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    TPD_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || fn == nullptr)
      throw Unavailable("wgmma engine: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<EncodeTiled>(fn);
  }();
  // Depth 1: [n, k] in boxes [box_rows, 64]. Above: [k / 64 chunks][n][64] (the
  // chunk dimension strides 128 bytes), in boxes [depth][box_rows][64]: each chunk
  // of a box lands as the [box_rows, 64] tile a depth-1 box would.
  const bool deep = depth > 1;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(deep ? wgmma::kChunkK : k), static_cast<cuuint64_t>(n),
                              static_cast<cuuint64_t>(k / wgmma::kChunkK)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(row_stride > 0 ? row_stride : k) * 2,
                                 static_cast<cuuint64_t>(wgmma::kChunkK) * 2};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(wgmma::kChunkK), static_cast<cuuint32_t>(box_rows),
                             static_cast<cuuint32_t>(depth)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  CUtensorMap map{};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, deep ? 3 : 2, const_cast<void*>(w), dims, strides,
                            box,
                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw InvalidArgument("wgmma engine: cuTensorMapEncodeTiled refused a [" + std::to_string(n) + ", " +
                          std::to_string(k) + "] operand (CUresult " + std::to_string(static_cast<int>(r)) + ")");
  return map;
}

bool wgmma_shape_built(int sub_tiles, int tokens) {
  return wgmma::with_kernel(sub_tiles, tokens, [](auto) {});
}

void prepare_wgmma() {
  if (wgmma::prepared_devices.has_current()) return;
  auto raise = [](auto kernel) {
    TPD_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemPerCtaMax));
  };
  for (int sub : {1, 2, 4})
    for (int tokens : {8, 16, 32, 64}) wgmma::with_kernel(sub, tokens, raise);
  for (int rows : wgmma::kWideRows) wgmma::with_wide_kernel(rows, raise);
  wgmma::prepared_devices.add_current();
}

bool wgmma_prepared() { return wgmma::prepared_devices.has_current(); }

int wgmma_resident_clusters(const WgmmaShape& shape) {
  prepare_wgmma();
  WgmmaShape s = shape;
  s.clusters = 1;
  int clusters = 0;
  const bool built = wgmma::with_shape_kernel(s, [&](auto kernel) {
    cudaLaunchAttribute attrs[2];
    const cudaLaunchConfig_t c = wgmma::config_of(s, attrs, false, nullptr);
    TPD_CUDA(cudaOccupancyMaxActiveClusters(&clusters, kernel, &c));
  });
  return built ? clusters : 0;
}

int wgmma_resident_clusters(int sub_tiles, int tokens, int split, int stages) {
  WgmmaShape s;
  s.sub_tiles = sub_tiles;
  s.tokens = tokens;
  s.split = split;
  s.stages = stages;
  return wgmma_resident_clusters(s);
}

void launch_wgmma(const CUtensorMap& w_map, const WgmmaParams& p, const WgmmaShape& s, bool pdl,
                  cudaStream_t stream) {
  // Why 64 rows in the wide form: the activations are wgmma's A (64 rows); the box
  // brings rows past m as zeros.
  const CUtensorMap x_map = wgmma_tile_map(p.x, p.m, p.k, s.wide ? wgmma::kTileRows : s.tokens);
  const bool built = wgmma::with_shape_kernel(s, [&](auto kernel) {
    cudaLaunchAttribute attrs[2];
    const cudaLaunchConfig_t c = wgmma::config_of(s, attrs, pdl, stream);
    TPD_CUDA(cudaLaunchKernelEx(&c, kernel, w_map, x_map, p, s.stages));
  });
  if (!built)
    throw InvalidArgument(s.wide ? "wgmma engine: no wide kernel for blocks of " + std::to_string(s.rows()) + " rows"
                                 : "wgmma engine: no kernel for " + std::to_string(s.sub_tiles) + " sub-tiles at " +
                                       std::to_string(s.tokens) + " tokens");
}

}  // namespace tpdecode
