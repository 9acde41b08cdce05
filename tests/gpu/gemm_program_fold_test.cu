// GemmProgram's folded norms on the GPU: a layer's chain with every norm that can be
// folded folded, each op checked against the CPU on its actual inputs: the residual
// streams bit for bit (bf16(x + residual)), a non-folded norm reading a folded
// norm's stream bit for bit against reference/program_norm.hpp, the folded norms'
// readers (a plain GEMM, a SiLU-mul epilogue, a GEMM of a window without residual)
// against FP64 of the exact norm; all bits repeatable over runs back to back with PDL;
// refusals of what a fold does not serve.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/bf16.hpp"
#include "gpu/gpu_test_util.hpp"
#include "gpu/program_reference.hpp"
#include "gpu/program_runs.hpp"
#include "reference/program_norm.hpp"
#include "tpdecode/gemm_program.hpp"

namespace tpdecode {
namespace {

using namespace test;

std::vector<uint16_t> window_of(const std::vector<uint16_t>& all, int m, int64_t stride, int64_t col, int64_t cols) {
  std::vector<uint16_t> w;
  for (int t = 0; t < m; ++t) w.insert(w.end(), all.begin() + t * stride + col, all.begin() + t * stride + col + cols);
  return w;
}

// bf16(x + residual), element by element: the residual stream a folded norm's producer stores.
std::vector<uint16_t> added(const std::vector<uint16_t>& x, const std::vector<uint16_t>& residual) {
  std::vector<uint16_t> h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) h[i] = bf16::from_float(bf16::to_float(x[i]) + bf16::to_float(residual[i]));
  return h;
}

// FP64 of a folded norm's reader: rstd_t * sum_c w[j, c] * gamma[c] * h[t, c] over
// the norm's k columns (h [m, k], w [n, k]); [m, n].
std::vector<double> folded_reference(const std::vector<uint16_t>& h, const std::vector<uint16_t>& gamma,
                                     const std::vector<uint16_t>& w, int m, int64_t k, int64_t n, double eps) {
  std::vector<double> out(static_cast<std::size_t>(m * n));
  for (int t = 0; t < m; ++t) {
    double sq = 0;
    for (int64_t c = 0; c < k; ++c) sq += std::pow(bf16::to_float(h[static_cast<std::size_t>(t * k + c)]), 2);
    const double rstd = 1 / std::sqrt(sq / static_cast<double>(k) + eps);
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t c = 0; c < k; ++c)
        s += static_cast<double>(bf16::to_float(w[static_cast<std::size_t>(j * k + c)])) *
             bf16::to_float(gamma[static_cast<std::size_t>(c)]) * bf16::to_float(h[static_cast<std::size_t>(t * k + c)]);
      out[static_cast<std::size_t>(t * n + j)] = rstd * s;
    }
  }
  return out;
}

// The layer's program (ops 0..10):
//  0 p = x0 W0                       1 norm of p + residual r (folded; h1)
//  2 q = norm1 W2 (folded reader)    3 norm of q + h1 (folded; h2)
//  4 act = silu-mul(norm3 W4)        5 u = act W5
//  6 norm of u + h2 (not folded: h2 from the mailbox; h3, x3)
//  7 pq = x3 W7 [m, 2048]            8 norm of pq[:, :1024] (folded, no residual)
//  9 norm of pq[:, 1024:1536] (not folded)   10 z = norm8 W10 (folded reader)
TEST(GemmProgramFold, FoldedNormsAgainstTheirReference) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  const int64_t k0 = 1024, d = 1536, inter = 1088, npq = 2048, ka = 1024, kb = 512, nz = 704;
  const float eps = 1e-6f;
  auto weight = [&](int64_t n, int64_t k) { return random_bf16(static_cast<std::size_t>(n * k), rng, 0.05f); };
  const std::vector<uint16_t> w0 = weight(d, k0), w2 = weight(d, d), w4 = weight(2 * inter, d), w5 = weight(d, inter),
                              w7 = weight(npq, d), w10 = weight(nz, ka);
  std::vector<std::vector<uint16_t>> gammas;
  for (int64_t k : {d, d, d, ka, kb}) gammas.push_back(random_bf16(static_cast<std::size_t>(k), rng));
  std::vector<DeviceBuffer> wd;
  for (const auto* w : {&w0, &w2, &w4, &w5, &w7, &w10}) wd.push_back(to_device(*w));
  std::vector<DeviceBuffer> gd;
  for (const auto& g : gammas) gd.push_back(to_device(g));
  for (int m : {1, 5, 8, 16, 28, 64}) {
    if (quick() && m != 1 && m != 5 && m != 28) continue;
    SCOPED_TRACE(testing::Message() << "m " << m);
    const std::vector<uint16_t> x0 = random_bf16(static_cast<std::size_t>(m * k0), rng);
    const std::vector<uint16_t> r = random_bf16(static_cast<std::size_t>(m * d), rng, 2.0f);
    DeviceBuffer x0d = to_device(x0), rd = to_device(r);
    auto buffer = [&](int64_t cols) { return DeviceBuffer(static_cast<std::size_t>(m * cols) * 2); };
    DeviceBuffer p = buffer(d), n1 = buffer(d), h1 = buffer(d), q = buffer(d), n3 = buffer(d), h2 = buffer(d),
                 act = buffer(inter), u = buffer(d), h3 = buffer(d), x3 = buffer(d), pq = buffer(npq), n8 = buffer(ka),
                 xb = buffer(kb), z = buffer(nz);
    auto view = [&](DeviceBuffer& b, int64_t cols) { return TensorView::bf16(b.get(), m, cols); };
    auto w = [&](int i, int64_t n, int64_t k) { return TensorView::bf16(wd[static_cast<std::size_t>(i)].get(), n, k); };
    auto gamma = [&](int i, int64_t k) { return TensorView::bf16(gd[static_cast<std::size_t>(i)].get(), 1, k); };
    TensorView pqa = view(pq, ka), pqb = TensorView::bf16(static_cast<uint16_t*>(pq.get()) + ka, m, kb);
    pqa.row_stride = pqb.row_stride = npq;
    GemmProgram::Norm f1{view(p, d), 0, gamma(0, d), eps, view(rd, d), view(h1, d), view(n1, d), true};
    GemmProgram::Norm f3{view(q, d), 2, gamma(1, d), eps, view(h1, d), view(h2, d), view(n3, d), true};
    GemmProgram::Norm n6{view(u, d), 5, gamma(2, d), eps, view(h2, d), view(h3, d), view(x3, d)};
    GemmProgram::Norm f8{pqa, 7, gamma(3, ka), eps, {}, {}, view(n8, ka), true};
    GemmProgram::Norm n9{pqb, 7, gamma(4, kb), eps, {}, {}, view(xb, kb)};
    const GemmProgram program(
        {GemmProgram::Gemm{w(0, d, k0), view(x0d, k0), view(p, d)}, f1,
         GemmProgram::Gemm{w(1, d, d), view(n1, d), view(q, d), 1}, f3,
         GemmProgram::Gemm{w(2, 2 * inter, d), view(n3, d), view(act, inter), 3, GemmProgram::Epilogue::kSiluMul},
         GemmProgram::Gemm{w(3, d, inter), view(act, inter), view(u, d), 4}, n6,
         GemmProgram::Gemm{w(4, npq, d), view(x3, d), view(pq, npq), 6}, f8, n9,
         GemmProgram::Gemm{w(5, nz, ka), view(n8, ka), view(z, nz), 8}},
        m);
    const std::vector<std::vector<uint16_t>> bits =
        repeatable_bits(program, {&p, &h1, &q, &h2, &act, &u, &h3, &x3, &pq, &xb, &z, &n1, &n3, &n8});
    const auto& [pb, h1b, qb, h2b, actb, ub, h3b, x3b, pqb_, xbb, zb] = std::tie(
        bits[0], bits[1], bits[2], bits[3], bits[4], bits[5], bits[6], bits[7], bits[8], bits[9], bits[10]);
    for (std::size_t i : {11, 12, 13})
      EXPECT_TRUE(std::all_of(bits[i].begin(), bits[i].end(), [](uint16_t v) { return v == kPoison16; }))
          << "a folded norm's out was written (output " << i << ")";
    EXPECT_LT(relative_error(pb, gemm_reference(x0, w0, m, k0, d)), 4e-3) << "op 0";
    EXPECT_TRUE(h1b == added(pb, r)) << "h1: p + r";
    EXPECT_LT(relative_error(qb, folded_reference(h1b, gammas[0], w2, m, d, d, eps)), 8e-3) << "op 2 (folded)";
    EXPECT_TRUE(h2b == added(qb, h1b)) << "h2: q + h1";
    // The SiLU-mul of the folded gate and up, in FP64.
    const std::vector<double> gate_up = folded_reference(h2b, gammas[1], w4, m, d, 2 * inter, eps);
    std::vector<double> act_ref(static_cast<std::size_t>(m * inter));
    for (int t = 0; t < m; ++t)
      for (int64_t j = 0; j < inter; ++j) {
        const double g = gate_up[static_cast<std::size_t>(t * 2 * inter + j)],
                     up = gate_up[static_cast<std::size_t>(t * 2 * inter + inter + j)];
        act_ref[static_cast<std::size_t>(t * inter + j)] = g / (1 + std::exp(-g)) * up;
      }
    EXPECT_LT(relative_error(actb, act_ref), 1.2e-2) << "op 4 (folded, SiLU-mul)";
    EXPECT_LT(relative_error(ub, gemm_reference(actb, w5, m, inter, d)), 4e-3) << "op 5";
    const reference::ArNormResult r6 = reference::program_norm(ub, h2b, gammas[2], eps, d, program.ctas());
    EXPECT_TRUE(h3b == r6.residual_out) << "h3: u + h2 (h2 read from the mailbox)";
    EXPECT_TRUE(x3b == r6.out) << "op 6's out";
    EXPECT_LT(relative_error(pqb_, gemm_reference(x3b, w7, m, d, npq)), 4e-3) << "op 7";
    EXPECT_TRUE(xbb == reference::program_norm(window_of(pqb_, m, npq, ka, kb), {}, gammas[4], eps, kb,
                                               program.ctas())
                           .out)
        << "op 9's out";
    EXPECT_LT(relative_error(zb, folded_reference(window_of(pqb_, m, npq, 0, ka), gammas[3], w10, m, ka, nz, eps)),
              8e-3)
        << "op 10 (folded, a window without residual)";
  }
}

TEST(GemmProgramFold, Refusals) {
  TPD_REQUIRE_GPU();
  const int m = 4;
  const int64_t k = 512, n = 512;
  DeviceBuffer w(n * k * 2), x(m * k * 2), p(m * n * 2), g(k * 2), res(m * n * 2), h(m * n * 2), out(m * n * 2),
      z(m * n * 2), y(m * n * 2);
  auto v = [&](DeviceBuffer& b, int64_t rows, int64_t cols) { return TensorView::bf16(b.get(), rows, cols); };
  const GemmProgram::Gemm producer{v(w, n, k), v(x, m, k), v(p, m, n)};
  const GemmProgram::Norm fold{v(p, m, n), 0, v(g, 1, n), 1e-6f, v(res, m, n), v(h, m, n), v(out, m, n), true};
  const GemmProgram::Gemm reader{v(w, n, k), v(out, m, n), v(z, m, n), 1};
  EXPECT_NO_THROW(GemmProgram({producer, fold, reader}, m));
  {  // x an input
    GemmProgram::Norm f = fold;
    f.after = -1;
    f.x = v(x, m, k);
    EXPECT_THROW(GemmProgram({producer, f, reader}, m), InvalidArgument);
  }
  {  // no GEMM reads it
    EXPECT_THROW(GemmProgram({producer, fold}, m), InvalidArgument);
  }
  {  // a norm reads it
    const GemmProgram::Norm after_fold{v(out, m, n), 1, v(g, 1, n), 1e-6f, {}, {}, v(z, m, n)};
    EXPECT_THROW(GemmProgram({producer, fold, reader, after_fold}, m), InvalidArgument);
  }
  {  // another op reads the producer's out, which publishes x + residual
    const GemmProgram::Gemm other{v(w, n, k), v(p, m, n), v(y, m, n), 0};
    EXPECT_THROW(GemmProgram({producer, fold, reader, other}, m), InvalidArgument);
  }
  {  // a window not on a 64-column boundary
    TensorView part = TensorView::bf16(static_cast<uint16_t*>(p.get()) + 32, m, 256);
    part.row_stride = n;
    const GemmProgram::Norm f{part, 0, v(g, 1, 256), 1e-6f, {}, {}, v(out, m, 256), true};
    const GemmProgram::Gemm r{v(w, n, 256), v(out, m, 256), v(z, m, n), 1};
    EXPECT_THROW(GemmProgram({producer, f, r}, m), InvalidArgument);
  }
  // A window of the producer's out folds without a residual; with one it must be the
  // whole out (the producer adds the residual at its own columns).
  for (const int64_t column : {int64_t{0}, int64_t{256}}) {
    SCOPED_TRACE(testing::Message() << "window from column " << column);
    TensorView part = TensorView::bf16(static_cast<uint16_t*>(p.get()) + column, m, 256);
    part.row_stride = n;
    const GemmProgram::Gemm r{v(w, n, 256), v(out, m, 256), v(z, m, n), 1};
    const GemmProgram::Norm plain{part, 0, v(g, 1, 256), 1e-6f, {}, {}, v(out, m, 256), true};
    EXPECT_NO_THROW(GemmProgram({producer, plain, r}, m));
    const GemmProgram::Norm adds{part, 0, v(g, 1, 256), 1e-6f, v(res, m, 256), v(h, m, 256), v(out, m, 256), true};
    EXPECT_THROW(GemmProgram({producer, adds, r}, m), InvalidArgument);
    GemmProgram::Norm stream_only = adds;
    stream_only.residual = {};
    EXPECT_THROW(GemmProgram({producer, stream_only, r}, m), InvalidArgument);
  }
  {  // the producer has the SiLU-mul epilogue
    GemmProgram::Gemm gated = producer;
    gated.epilogue = GemmProgram::Epilogue::kSiluMul;
    gated.out = v(p, m, n / 2);
    GemmProgram::Norm f = fold;
    f.x = v(p, m, n / 2);
    f.weight = v(g, 1, n / 2);
    f.residual = v(res, m, n / 2);
    f.residual_out = v(h, m, n / 2);
    f.out = v(out, m, n / 2);
    const GemmProgram::Gemm r{v(w, n, n / 2), v(out, m, n / 2), v(z, m, n), 1};
    EXPECT_THROW(GemmProgram({gated, f, r}, m), InvalidArgument);
  }
}

}  // namespace
}  // namespace tpdecode
