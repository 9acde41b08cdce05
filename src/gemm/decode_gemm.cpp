#include "tpdecode/decode_gemm.hpp"

#include <fmt/format.h>

#include "gemm/warp_splitk_launch.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TPD_CUDA(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

void require_matrix(const TensorView& t, int64_t cols, const char* what) {
  require(t.data != nullptr, fmt::format("decode_gemm: {} is null", what));
  require(t.dtype == DType::kBF16, fmt::format("decode_gemm: {} is {} where bf16 is required", what, dtype_name(t.dtype)));
  require(t.rows >= 1, fmt::format("decode_gemm: {} has {} rows", what, t.rows));
  require(t.cols == cols, fmt::format("decode_gemm: {} has {} columns where {} are required", what, t.cols, cols));
  require(t.row_stride >= t.cols, fmt::format("decode_gemm: {} row stride below its columns ({})", what, t.describe()));
  require(reinterpret_cast<std::uintptr_t>(t.data) % 2 == 0, fmt::format("decode_gemm: {} is not 2-byte aligned", what));
}

}  // namespace

const char* gemm_path_name(GemmPath p) { return p == GemmPath::kWarpSplitK ? "warp" : "cublas"; }

DecodeGemm::DecodeGemm(const TensorView& weight, std::shared_ptr<CublasContext> cublas)
    : weight_(weight), cublas_(std::move(cublas)) {
  require_matrix(weight, weight.cols, "weight");
  require(weight.cols >= 1, "decode_gemm: weight has no columns");
  if (!cublas_) cublas_ = std::make_shared<CublasContext>();
  eligible_ = warp_weight_ok(weight);
  int device = 0;
  TPD_CUDA(cudaGetDevice(&device));
  TPD_CUDA(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
}

void DecodeGemm::prepare(int m, cudaStream_t stream) {
  require(!capturing(stream), "decode_gemm: prepare() under stream capture");
  if (!eligible_ || m < 1 || m > kWarpMaxRows || ready_[m]) return;
  tactics_[m] = choose_tactic(n(), k(), m, sms_);
  prepare_warp_splitk(tactics_[m].token_tiles);
  ready_[m] = true;
}

void DecodeGemm::set_split(int m, int split) {
  require(eligible_ && m >= 1 && m <= kWarpMaxRows, "decode_gemm: set_split on a shape or M the engine does not take");
  tactics_[m] = tactic_with_split(n(), k(), m, sms_, split);
  prepare_warp_splitk(tactics_[m].token_tiles);
  ready_[m] = true;
}

bool DecodeGemm::prepared(int m) const { return m >= 1 && m <= kWarpMaxRows && ready_[m]; }

const GemmTactic& DecodeGemm::tactic(int m) const {
  require(prepared(m), fmt::format("decode_gemm: no engine prepared for {} rows", m));
  return tactics_[m];
}

bool DecodeGemm::engine_for(int64_t m) const {
  return m >= 1 && m <= kWarpMaxRows && ready_[m] &&
         (dispatch_ == GemmDispatch::kEngine || tactics_[m].engine_preferred);
}

GemmPath DecodeGemm::path(int m) const { return engine_for(m) ? GemmPath::kWarpSplitK : GemmPath::kCublas; }

GemmPath DecodeGemm::path(const TensorView& x, const TensorView& out) const {
  check(x, out);
  return engine_takes(x) && engine_for(x.rows) ? GemmPath::kWarpSplitK : GemmPath::kCublas;
}

void DecodeGemm::check(const TensorView& x, const TensorView& out) const {
  require_matrix(x, k(), "x");
  require_matrix(out, n(), "out");
  require(out.rows == x.rows, fmt::format("decode_gemm: out has {} rows, x has {}", out.rows, x.rows));
}

bool DecodeGemm::engine_takes(const TensorView& x) const { return eligible_ && warp_activations_ok(x); }

GemmPath DecodeGemm::run(const TensorView& x, const TensorView& out, cudaStream_t stream) {
  check(x, out);
  const int64_t m = x.rows;
  if (engine_takes(x) && !ready_[m] && !capturing(stream)) prepare(static_cast<int>(m), stream);
  if (engine_takes(x) && engine_for(m)) {
    WarpSplitKParams p{};
    p.w = weight_.data;
    p.x = x.data;
    p.out = out.data;
    p.m = static_cast<int>(m);
    p.chunks = static_cast<int>(k() / kWarpChunkK);
    p.n = n();
    p.k = k();
    p.out_stride = out.row_stride;
    launch_warp_splitk(p, tactics_[m], pdl_, stream);
    return GemmPath::kWarpSplitK;
  }
  cublas_->gemm(x, weight_, out, stream);
  return GemmPath::kCublas;
}

}  // namespace tpdecode
