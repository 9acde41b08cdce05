#include "gpu/gemm_problem.hpp"

#include <algorithm>
#include <cstdlib>

#include "core/bf16.hpp"
#include "core/random_fill.hpp"
#include "gemm/gemm_tactic.hpp"
#include "reference/gemm.hpp"

namespace tpdecode::test {

namespace {

// Counts elements where a != b (as bits), into *count.
__global__ void count_differences_kernel(const uint16_t* a, const uint16_t* b, int64_t n, unsigned long long* count) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    local += a[i] != b[i];
  if (local) atomicAdd(count, local);
}

}  // namespace

void fill_uniform(void* p, int64_t count, std::mt19937_64& rng, cudaStream_t stream, float scale) {
  fill_uniform_bf16(p, count, rng(), scale, stream);
}

uint64_t count_differences(const void* a, const void* b, int64_t n) {
  DeviceBuffer count(sizeof(unsigned long long));
  TPD_CUDA(cudaMemset(count.get(), 0, sizeof(unsigned long long)));
  count_differences_kernel<<<256, 256>>>(static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), n,
                                         count.as<unsigned long long>());
  TPD_CUDA(cudaGetLastError());
  return to_host<unsigned long long>(count, 1)[0];
}

std::shared_ptr<GemmTuner> private_tuner(bool enabled) {
  GemmTunerOptions o;
  o.enabled = enabled;
  return std::make_shared<GemmTuner>(o);
}

int sm_count() {
  int sms = 0;
  TPD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  return sms;
}

Problem::Problem(int64_t n_, int64_t k_, std::mt19937_64& rng)
    : n(n_), k(k_), w(static_cast<std::size_t>(n_ * k_) * 2), x(static_cast<std::size_t>(kProblemRows * k_) * 2) {
  fill_uniform(w.get(), n * k, rng);
  fill_uniform(x.get(), kProblemRows * k, rng);
  TPD_CUDA(cudaDeviceSynchronize());
  x_host = to_host<uint16_t>(x, static_cast<std::size_t>(kProblemRows * k));
  columns = {0, n - 1};
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  while (static_cast<int64_t>(columns.size()) < std::min<int64_t>(n, kSampledColumns)) columns.push_back(pick(rng));
  std::vector<uint16_t> w_rows(columns.size() * static_cast<std::size_t>(k));
  for (std::size_t c = 0; c < columns.size(); ++c)
    TPD_CUDA(cudaMemcpy(w_rows.data() + c * k, w.as<uint16_t>() + columns[c] * k, static_cast<std::size_t>(k) * 2,
                        cudaMemcpyDeviceToHost));
  ref = reference::gemm_bf16(x_host, w_rows, kProblemRows, static_cast<int64_t>(columns.size()), k);
}

double Problem::error(const DeviceBuffer& out, int m) const {
  const std::vector<uint16_t> got = to_host<uint16_t>(out, static_cast<std::size_t>(m * n));
  std::vector<double> a, r;
  for (int row = 0; row < m; ++row)
    for (std::size_t c = 0; c < columns.size(); ++c) {
      a.push_back(bf16::to_float(got[row * n + columns[c]]));
      r.push_back(ref[row * columns.size() + c]);
    }
  return reference::relative_error(a, r);
}

void check_rows(const Problem& p, DecodeGemm& gemm, CublasContext& cublas, int m, int repeats) {
  const GemmDecision& d = gemm.decision(m);
  SCOPED_TRACE(testing::Message() << p.n << "x" << p.k << " M " << m << " " << describe(d));
  const std::size_t bytes = static_cast<std::size_t>(m * p.n) * 2;
  DeviceBuffer out(bytes), again(bytes), base(bytes);
  poison(out);
  poison(base);
  EXPECT_EQ(gemm.run(p.rows(m), TensorView::bf16(out.get(), m, p.n), nullptr), d.path);
  cublas.gemm(p.rows(m), p.weight(), TensorView::bf16(base.get(), m, p.n), nullptr);
  TPD_CUDA(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = to_host<uint16_t>(out, bytes / 2);
  ASSERT_EQ(std::count(got.begin(), got.end(), kPoison16), 0) << "output elements left unwritten";
  const double ours = p.error(out, m);
  const double theirs = p.error(base, m);
  EXPECT_LE(ours, theirs * (1 + kRelSlack) + kAbsSlack) << "cuBLAS " << theirs;
  EXPECT_LT(ours, 1e-2);
  for (int r = 0; r < repeats; ++r) {
    poison(again);
    gemm.run(p.rows(m), TensorView::bf16(again.get(), m, p.n), nullptr);
    ASSERT_EQ(count_differences(out.get(), again.get(), m * p.n), 0u) << "run " << r + 2 << " differs";
  }
}

}  // namespace tpdecode::test
