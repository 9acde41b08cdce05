#include "tpdecode/cublas_context.hpp"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>

#include "core/check.hpp"
#include "core/relaxed_capture_mode.hpp"
#include "gemm/gemm_tactic.hpp"
#include "tpdecode/device_buffer.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

static_assert(sizeof(CublasLtAlgo) == sizeof(cublasLtMatmulAlgo_t), "CublasLtAlgo holds a cublasLtMatmulAlgo_t");

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(fmt::format("cuBLAS {} failed: {}", what, cublasGetStatusString(s)));
}

cublasLtMatmulAlgo_t to_lt(const CublasLtAlgo& a) {
  cublasLtMatmulAlgo_t algo;
  std::memcpy(&algo, a.data(), sizeof algo);
  return algo;
}

CublasLtAlgo from_lt(const cublasLtMatmulAlgo_t& algo) {
  CublasLtAlgo a;
  std::memcpy(a.data(), &algo, sizeof algo);
  return a;
}

// The cuBLASLt descriptors of out^T [N, M] = W [N, K] * x^T [K, M] in column-major
// terms: A = W read as [K, N] with op T, B = x read as [K, M], C = D = out^T.
struct LtProblem {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;

  LtProblem(const TensorView& x, const TensorView& w, const TensorView& out) {
    check_cublas(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
    const cublasOperation_t transpose = CUBLAS_OP_T;
    const cublasOperation_t none = CUBLAS_OP_N;
    check_cublas(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose), "transa");
    check_cublas(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof none), "transb");
    check_cublas(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, static_cast<uint64_t>(w.cols), static_cast<uint64_t>(w.rows),
                                            w.row_stride),
                 "layout W");
    check_cublas(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, static_cast<uint64_t>(x.cols), static_cast<uint64_t>(x.rows),
                                            x.row_stride),
                 "layout x");
    check_cublas(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, static_cast<uint64_t>(out.cols),
                                            static_cast<uint64_t>(out.rows), out.row_stride),
                 "layout out");
  }
  ~LtProblem() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
  LtProblem(const LtProblem&) = delete;
  LtProblem& operator=(const LtProblem&) = delete;
};

template <class T>
T algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute) {
  T v{};
  std::size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, &v, sizeof v, &written);
  return v;
}

}  // namespace

struct CublasContext::Impl {
  cublasHandle_t handle = nullptr;
  cublasLtHandle_t lt = nullptr;
  int device = 0;
  std::size_t workspace_bytes = 0;
  // Why one per stream: a cuBLAS call's workspace is in use until the call ends on
  // its stream, so calls on two streams at once need two. Made on a stream's first
  // call, kept while the context lives (a graph captured on that stream keeps
  // using it).
  std::mutex mutex;  // the map, and the handle's stream and workspace until the call is queued
  std::map<cudaStream_t, DeviceBuffer> workspaces;

  // The caller holds `mutex`.
  void* workspace_for(cudaStream_t stream) {
    if (!workspace_bytes) return nullptr;
    auto it = workspaces.find(stream);
    if (it == workspaces.end()) {
      // Why relaxed: a first call may come under capture (an engine capturing on a
      // stream of its own); the allocation is not a stream operation.
      const RelaxedCaptureMode relaxed;
      int current = 0;
      TPD_CUDA(cudaGetDevice(&current));
      check(current == device, "cublas: a call on device {} with the context of device {}", current, device);
      it = workspaces.emplace(stream, DeviceBuffer(workspace_bytes)).first;
    }
    return it->second.get();
  }
};

CublasContext::CublasContext(std::size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  TPD_CUDA(cudaGetDevice(&impl_->device));
  check_cublas(cublasCreate(&impl_->handle), "create");
  const cublasStatus_t lt = cublasLtCreate(&impl_->lt);
  if (lt != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(impl_->handle);
    check_cublas(lt, "Lt create");
  }
  impl_->workspace_bytes = workspace_bytes;
}

CublasContext::~CublasContext() {
  if (impl_->lt) cublasLtDestroy(impl_->lt);
  if (impl_->handle) cublasDestroy(impl_->handle);
}

std::size_t CublasContext::workspace_count() const {
  const std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->workspaces.size();
}

void CublasContext::gemm(const TensorView& x, const TensorView& w, const TensorView& out, cudaStream_t stream) {
  // Column-major view: out^T [N, M] = W [N, K] (op T of the [K, N] column-major
  // weight) times x^T [K, M].
  // Why: cublasGemmEx takes 32-bit sizes and leading dimensions.
  for (int64_t v : {w.rows, x.rows, x.cols, w.row_stride, x.row_stride, out.row_stride})
    check(v <= std::numeric_limits<int>::max(), "cublas gemm: a size or row stride of {} (at most 2^31 - 1)", v);
  const std::lock_guard<std::mutex> lock(impl_->mutex);
  void* workspace = impl_->workspace_for(stream);
  check_cublas(cublasSetStream(impl_->handle, stream), "set stream");
  // Why: cublasSetStream resets the workspace to cuBLAS's pool, which would allocate
  // under graph capture; the stream's own workspace is set again after it, every call.
  check_cublas(cublasSetWorkspace(impl_->handle, workspace, impl_->workspace_bytes), "set workspace");
  const float alpha = 1.0f;
  const float beta = 0.0f;
  check_cublas(cublasGemmEx(impl_->handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows), static_cast<int>(x.rows),
                            static_cast<int>(x.cols), &alpha, w.data, CUDA_R_16BF, static_cast<int>(w.row_stride),
                            x.data, CUDA_R_16BF, static_cast<int>(x.row_stride), &beta, out.data, CUDA_R_16BF,
                            static_cast<int>(out.row_stride), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "gemm");
}

void CublasContext::gemm_lt(const TensorView& x, const TensorView& w, const TensorView& out, const CublasLtAlgo& algo,
                            cudaStream_t stream) {
  const LtProblem p(x, w, out);
  const cublasLtMatmulAlgo_t a = to_lt(algo);
  const float alpha = 1.0f;
  const float beta = 0.0f;
  const std::lock_guard<std::mutex> lock(impl_->mutex);
  check_cublas(cublasLtMatmul(impl_->lt, p.op, &alpha, w.data, p.a, x.data, p.b, &beta, out.data, p.c, out.data, p.c,
                              &a, impl_->workspace_for(stream), impl_->workspace_bytes, stream),
               "Lt matmul");
}

std::vector<CublasLtAlgo> CublasContext::lt_algorithms(const TensorView& x, const TensorView& w,
                                                       const TensorView& out, int count) {
  const LtProblem p(x, w, out);
  cublasLtMatmulPreference_t pref = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref), "preference");
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<std::size_t>(count));
  int returned = 0;
  // Why COMPUTE_TYPE only: the in-place and output-type split-K reductions add
  // partial sums in BF16 (more than one rounding); the FP32 one keeps the contract.
  const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                          &impl_->workspace_bytes, sizeof impl_->workspace_bytes);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions,
                                             sizeof reductions);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulAlgoGetHeuristic(impl_->lt, p.op, p.a, p.b, p.c, p.c, pref, count, results.data(), &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  std::vector<CublasLtAlgo> algos;
  if (s != CUBLAS_STATUS_SUCCESS) return algos;  // no heuristic answer: no cuBLASLt candidates
  for (int i = 0; i < returned; ++i)
    if (results[static_cast<std::size_t>(i)].state == CUBLAS_STATUS_SUCCESS)
      algos.push_back(from_lt(results[static_cast<std::size_t>(i)].algo));
  return algos;
}

bool CublasContext::lt_algorithm_ok(const TensorView& x, const TensorView& w, const TensorView& out,
                                    const CublasLtAlgo& algo) {
  const LtProblem p(x, w, out);
  const cublasLtMatmulAlgo_t a = to_lt(algo);
  cublasLtMatmulHeuristicResult_t result{};
  return cublasLtMatmulAlgoCheck(impl_->lt, p.op, p.a, p.b, p.c, p.c, &a, &result) == CUBLAS_STATUS_SUCCESS &&
         result.workspaceSize <= impl_->workspace_bytes &&
         algo_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) != CUBLASLT_REDUCTION_SCHEME_INPLACE &&
         algo_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) != CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
}

std::string CublasContext::describe_lt(const CublasLtAlgo& algo) {
  const cublasLtMatmulAlgo_t a = to_lt(algo);
  const int id = algo_config<int>(a, CUBLASLT_ALGO_CONFIG_ID);
  const uint32_t tile = algo_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID);
  const uint32_t splits = algo_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
  return fmt::format("algo {} tile {} split-K {}", id, tile, splits);
}

std::string CublasContext::lt_version() { return fmt::format("{}", cublasLtGetVersion()); }

}  // namespace tpdecode
