// Helpers of DecodeGemm's GPU tests: one weight with fresh data and its FP64
// reference, the checks of one (shape, M, decision), bitwise comparison on the GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gpu/gpu_test_util.hpp"
#include "tpdecode/decode_gemm.hpp"

namespace tpdecode::test {

// Error slack: the engine's relative error (vs FP64) may exceed cuBLAS's by 10 %
// of it plus 1e-5. Both accumulate in FP32 and round once to BF16, so both errors
// are the BF16 rounding (~1e-3); a wrong sum shows up as O(1).
inline constexpr double kRelSlack = 0.10;
inline constexpr double kAbsSlack = 1e-5;
inline constexpr int kSampledColumns = 256;
inline constexpr int kProblemRows = 64;  // the most rows any engine takes

void fill_uniform(void* p, int64_t count, std::mt19937_64& rng, cudaStream_t stream = nullptr, float scale = 1.0f);
// Elements where a != b (as bits).
uint64_t count_differences(const void* a, const void* b, int64_t n);
// A tuner of the test's own: no file, and tuning only where a test asks for it.
std::shared_ptr<GemmTuner> private_tuner(bool enabled);
int sm_count();

// One weight with fresh data, the FP64 reference on a sample of its rows.
struct Problem {
  int64_t n, k;
  DeviceBuffer w;                // [N, K] bf16
  DeviceBuffer x;                // [kProblemRows, K] bf16: a call of M rows uses the first M
  std::vector<int64_t> columns;  // sampled output columns
  std::vector<double> ref;       // [kProblemRows, columns] FP64
  std::vector<uint16_t> x_host;

  Problem(int64_t n, int64_t k, std::mt19937_64& rng);
  TensorView weight() const { return TensorView::bf16(w.get(), n, k); }
  TensorView rows(int m) const { return TensorView::bf16(x.get(), m, k); }
  // Relative error of out[m, N] on the sampled columns.
  double error(const DeviceBuffer& out, int m) const;
};

// Every check of one (shape, M, the decision prepared for M): the path taken, the
// error vs cuBLAS's, every element written, bitwise repeats.
void check_rows(const Problem& p, DecodeGemm& gemm, CublasContext& cublas, int m, int repeats);

}  // namespace tpdecode::test
