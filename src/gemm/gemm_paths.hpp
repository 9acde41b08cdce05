// Running a decision (gemm_paths.cpp): what each path needs prepared and its
// launch; and timing candidates for the tuner (gemm_measure.cpp). Operands are
// checked by the caller (decode_gemm.cpp).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "core/relaxed_capture_mode.hpp"
#include "gemm/gemm_tactic.hpp"
#include "gemm/wgmma_launch.hpp"
#include "tpdecode/cublas_context.hpp"
#include "tpdecode/gemm_tuner.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode {

// The weight's map for the warp engine's tensor-map form ([2][16][64] boxes).
CUtensorMap warp_tensor_map_of(const TensorView& weight);
// The launch shape of a wgmma decision (either form) at m rows.
WgmmaShape wgmma_shape_of(const GemmDecision& d, int m);

// Host work `d` needs before it launches m rows of `weight` (the engines' kernel
// attributes); returns `d` as it launches here: a wgmma decision's clusters 0
// becomes the row blocks or the clusters this GPU holds at once, the fewer. Never
// under capture.
GemmDecision prepare_path(const GemmDecision& d, const TensorView& weight, int m);
// Whether the preparation `d` needs is in place (so it can launch under capture).
bool path_prepared(const GemmDecision& d);
// Launches `d` (from prepare_path) for out = x * weight^T on `stream`. w_map: the
// weight's tile map for a wgmma decision (wgmma_tile_map at its sub-tiles' rows) or
// a warp decision of the tensor-map form (warp_tensor_map_of), or null to encode it
// here.
void launch_path(const GemmDecision& d, const TensorView& weight, const TensorView& x, const TensorView& out,
                 CublasContext& ctx, bool pdl, cudaStream_t stream, const CUtensorMap* w_map = nullptr);

// The tuner's timing of the candidates on m rows of `weight`: CUDA graphs of
// back-to-back calls over rotating copies of the weight (at least 3 x L2 in all, so
// no call finds its weight in L2; one copy where the weight alone is that large),
// made once here, each replayed once untimed and its output checked: a candidate
// whose output differs from cuBLAS's is reported through `warn` and marked failed
// (never timed). GemmTiming::time replays them interleaved; replays() is 5, or 3
// where one graph streams more than 1 GB. Waits for `stream` first (the weight is
// ready, nothing of the caller's overlaps); times on a stream of its own. Host
// only; never under capture; made, used and destroyed on one thread (it holds that
// thread in relaxed capture mode), within the lifetime of `weight` and `ctx`.
std::unique_ptr<GemmTiming> time_paths(const std::vector<GemmDecision>& candidates, const TensorView& weight, int m,
                                       CublasContext& ctx, bool pdl, cudaStream_t stream, const GemmWarning& warn);

}  // namespace tpdecode
