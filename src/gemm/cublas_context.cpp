#include "tpdecode/cublas_context.hpp"

#include <cublas_v2.h>
#include <fmt/format.h>

#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(fmt::format("cuBLAS {} failed: {}", what, cublasGetStatusString(s)));
}

}  // namespace

struct CublasContext::Impl {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;  // [workspace_bytes] bytes
  std::size_t workspace_bytes = 0;
};

CublasContext::CublasContext(std::size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  check_cublas(cublasCreate(&impl_->handle), "create");
  impl_->workspace_bytes = workspace_bytes;
  if (workspace_bytes) {
    const cudaError_t e = cudaMalloc(&impl_->workspace, workspace_bytes);
    if (e != cudaSuccess) {
      cublasDestroy(impl_->handle);
      TPD_CUDA(e);
    }
  }
}

CublasContext::~CublasContext() {
  if (impl_->handle) cublasDestroy(impl_->handle);
  if (impl_->workspace) cudaFree(impl_->workspace);
}

void CublasContext::gemm(const TensorView& x, const TensorView& w, const TensorView& out, cudaStream_t stream) {
  // Column-major view: out^T [N, M] = W [N, K] (op T of the [K, N] column-major
  // weight) times x^T [K, M].
  check_cublas(cublasSetStream(impl_->handle, stream), "set stream");
  // Why: cublasSetStream resets the workspace to cuBLAS's pool, which would allocate
  // under graph capture; our own workspace is set again after it, every call.
  check_cublas(cublasSetWorkspace(impl_->handle, impl_->workspace, impl_->workspace_bytes), "set workspace");
  const float alpha = 1.0f;
  const float beta = 0.0f;
  check_cublas(cublasGemmEx(impl_->handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows), static_cast<int>(x.rows),
                            static_cast<int>(x.cols), &alpha, w.data, CUDA_R_16BF, static_cast<int>(w.row_stride),
                            x.data, CUDA_R_16BF, static_cast<int>(x.row_stride), &beta, out.data, CUDA_R_16BF,
                            static_cast<int>(out.row_stride), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "gemm");
}

}  // namespace tpdecode
