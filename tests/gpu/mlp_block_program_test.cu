// MlpBlockProgram on the GPU: each form of the block (o_proj or not, next norm or
// not, qkv or not; folded and unfolded), as a program up to 16 rows and as launches
// above, against an FP64 reference that rounds to BF16 where the unfolded block
// stores (o, the residual stream, the norms' outs, gate and up, the activation, y):
// its out and its residual within tolerance, every output written; two runs back to
// back with PDL give the bits of a run from the first one's residual; a CUDA graph's
// replays give run 0's bits. Tensors the launches do not serve keep the program.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "core/bf16.hpp"
#include "gpu/gpu_test_util.hpp"
#include "gpu/mlp_block_reference.hpp"
#include "gpu/program_reference.hpp"
#include "tpdecode/mlp_block_program.hpp"

namespace tpdecode {
namespace {

using namespace test;

constexpr int64_t kH = 1024, kI = 1536, kA = 768, kQ = 640;
constexpr float kEps = 1e-6f;

struct Form {
  bool o_proj, next_norm, qkv, fold;
};

TEST(MlpBlockProgram, EveryFormAgainstItsReference) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  auto weight = [&](int64_t n, int64_t k) { return random_bf16(static_cast<std::size_t>(n * k), rng, 0.05f); };
  const std::vector<uint16_t> wo = weight(kH, kA), wgu = weight(2 * kI, kH), wd = weight(kH, kI), wq = weight(kQ, kH),
                              g1 = random_bf16(kH, rng), g2 = random_bf16(kH, rng);
  const DeviceBuffer wo_d = to_device(wo), wgu_d = to_device(wgu), wd_d = to_device(wd), wq_d = to_device(wq),
                     g1_d = to_device(g1), g2_d = to_device(g2);
  const Form forms[] = {{true, true, true, true},   {true, true, true, false},  {false, true, true, true},
                        {true, true, false, true},  {true, false, false, true}, {false, false, false, false}};
  for (int m : {1, 5, 16, 17, 28, 64}) {
    if (quick() && m != 1 && m != 16 && m != 28) continue;
    for (const Form& f : forms) {
      SCOPED_TRACE(testing::Message() << "m " << m << (f.o_proj ? " o_proj" : "") << (f.next_norm ? " next_norm" : "")
                                      << (f.qkv ? " qkv" : "") << (f.fold ? " folded" : " unfolded"));
      const int64_t a = f.o_proj ? kA : kH, q = f.qkv ? kQ : kH;
      const std::vector<uint16_t> attn = random_bf16(static_cast<std::size_t>(m * a), rng),
                                  r0 = random_bf16(static_cast<std::size_t>(m * kH), rng, 2.0f);
      DeviceBuffer attn_d = to_device(attn), r0_d = to_device(r0), res_d = to_device(r0),
                   out_d(static_cast<std::size_t>(m * q) * 2);
      auto restore = [&](const DeviceBuffer& from) {  // the residual is updated in place
        TPD_CUDA(cudaMemcpyAsync(res_d.get(), from.get(), r0.size() * 2, cudaMemcpyDeviceToDevice, nullptr));
        poison(out_d);
      };
      auto v = [](const DeviceBuffer& b, int64_t rows, int64_t cols) {
        return TensorView::bf16(b.get(), rows, cols);
      };
      MlpBlockProgram::Weights w{f.o_proj ? v(wo_d, kH, kA) : TensorView{}, v(g1_d, 1, kH), v(wgu_d, 2 * kI, kH),
                                 v(wd_d, kH, kI), f.next_norm ? v(g2_d, 1, kH) : TensorView{},
                                 f.qkv ? v(wq_d, kQ, kH) : TensorView{}, kEps};
      const MlpBlockProgram block(w, {v(attn_d, m, a), v(res_d, m, kH), v(out_d, m, q)}, m, f.fold);
      const bool launches = m > MlpBlockProgram::kProgramMaxRows;
      EXPECT_EQ(block.form(), launches ? MlpBlockProgram::Form::kLaunches : MlpBlockProgram::Form::kProgram);
      EXPECT_EQ(block.post_norm_folded(), !launches && f.fold && f.o_proj);
      EXPECT_EQ(block.next_norm_folded(), !launches && f.fold && f.o_proj && f.qkv);
      if (launches) EXPECT_THROW(block.program(), InvalidArgument);

      // The reference, rounded where the unfolded program stores.
      std::vector<uint16_t> residual = r0;
      const std::vector<uint16_t> o = f.o_proj ? rounded(gemm_reference(attn, wo, m, kA, kH)) : attn;
      const std::vector<uint16_t> h = add_norm(residual, o, g1, m, kEps);
      const std::vector<uint16_t> act = silu_mul(rounded(gemm_reference(h, wgu, m, kH, 2 * kI)), m, kI);
      const std::vector<uint16_t> y = rounded(gemm_reference(act, wd, m, kI, kH));
      std::vector<double> out_ref = values(y);
      if (f.next_norm) {
        const std::vector<uint16_t> h2 = add_norm(residual, y, g2, m, kEps);
        out_ref = f.qkv ? gemm_reference(h2, wq, m, kH, kQ) : values(h2);
      }

      // Run 0 from r0; then from run 0's residual (r1) once, and from r0 twice back to
      // back with PDL (the second run's bits must be those of a run from r1); then a
      // graph's replays from r0.
      auto bits_after = [&](const DeviceBuffer& from, const std::function<void()>& launch) {
        restore(from);
        TPD_CUDA(cudaDeviceSynchronize());
        launch();
        TPD_CUDA(cudaDeviceSynchronize());
        return std::make_pair(to_host<uint16_t>(out_d, static_cast<std::size_t>(m * q)),
                              to_host<uint16_t>(res_d, r0.size()));
      };
      const auto first = bits_after(r0_d, [&] { block.run(nullptr, false); });
      const std::vector<uint16_t>& out_bits = first.first;
      const std::vector<uint16_t>& res_bits = first.second;
      const DeviceBuffer r1_d = to_device(res_bits);
      const auto second = bits_after(r1_d, [&] { block.run(nullptr, true); });
      EXPECT_TRUE(bits_after(r0_d, [&] {
                    block.run(nullptr, true);
                    block.run(nullptr, true);
                  }) == second)
          << "two runs back to back differ from a run from the first one's residual";
      EXPECT_LT(relative_error(out_bits, out_ref), block.post_norm_folded() ? 1.5e-2 : 1e-2) << "out";
      // The residual's second add takes y, which a folded post norm moves by its
      // roundings (about 1 %: the fold test's bound): 5e-3 measured on the random data.
      EXPECT_LT(relative_error(res_bits, values(residual)), block.post_norm_folded() ? 8e-3 : 3e-3) << "residual";
      cudaStream_t stream;
      TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      TPD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      block.run(stream);
      TPD_CUDA(cudaStreamEndCapture(stream, &graph));
      TPD_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      for (int replay = 0; replay < 2; ++replay)
        EXPECT_TRUE(bits_after(r0_d, [&] {
                      TPD_CUDA(cudaGraphLaunch(exec, stream));
                      TPD_CUDA(cudaStreamSynchronize(stream));
                    }) == first)
            << "replay " << replay << " differs from run 0";
      TPD_CUDA(cudaGraphExecDestroy(exec));
      TPD_CUDA(cudaGraphDestroy(graph));
      TPD_CUDA(cudaStreamDestroy(stream));
    }
  }
}

// A fold the program refuses (at 8 rows the row sums of a 16384-column norm are more
// than the finisher's handoff holds: Unavailable): the block keeps both norms as norm
// ops and gives its reference.
TEST(MlpBlockProgram, AFoldTheProgramRefusesRunsAsANormOp) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  const int m = 8;
  const int64_t h = 16384, inter = 64, a = 64;
  const std::vector<uint16_t> wo = random_bf16(static_cast<std::size_t>(h * a), rng, 0.05f),
                              wgu = random_bf16(static_cast<std::size_t>(2 * inter * h), rng, 0.02f),
                              wd = random_bf16(static_cast<std::size_t>(h * inter), rng, 0.05f),
                              g1 = random_bf16(static_cast<std::size_t>(h), rng),
                              attn = random_bf16(static_cast<std::size_t>(m * a), rng),
                              r0 = random_bf16(static_cast<std::size_t>(m * h), rng, 2.0f);
  const DeviceBuffer wo_d = to_device(wo), wgu_d = to_device(wgu), wd_d = to_device(wd), g1_d = to_device(g1),
                     attn_d = to_device(attn);
  DeviceBuffer res_d = to_device(r0), out_d(static_cast<std::size_t>(m * h) * 2);
  auto v = [](const DeviceBuffer& b, int64_t rows, int64_t cols) { return TensorView::bf16(b.get(), rows, cols); };
  const MlpBlockProgram block({v(wo_d, h, a), v(g1_d, 1, h), v(wgu_d, 2 * inter, h), v(wd_d, h, inter), {}, {}, kEps},
                              {v(attn_d, m, a), v(res_d, m, h), v(out_d, m, h)}, m);
  EXPECT_FALSE(block.post_norm_folded());
  poison(out_d);
  block.run(nullptr);
  TPD_CUDA(cudaDeviceSynchronize());
  std::vector<uint16_t> residual = r0;
  const std::vector<uint16_t> hn = add_norm(residual, rounded(gemm_reference(attn, wo, m, a, h)), g1, m, kEps);
  const std::vector<uint16_t> act = silu_mul(rounded(gemm_reference(hn, wgu, m, h, 2 * inter)), m, inter);
  EXPECT_LT(relative_error(to_host<uint16_t>(out_d, static_cast<std::size_t>(m * h)),
                           gemm_reference(act, wd, m, inter, h)),
            1e-2)
      << "out";
  EXPECT_LT(relative_error(to_host<uint16_t>(res_d, r0.size()), values(residual)), 3e-3) << "residual";
}

// Above 16 rows a residual the norm kernel cannot take (rows not contiguous) keeps the
// block a program, with its reference; the launches asked for are refused.
TEST(MlpBlockProgram, AStridedResidualKeepsTheProgram) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  const int m = 40;
  const int64_t stride = kH + 64;
  const std::vector<uint16_t> wgu = random_bf16(static_cast<std::size_t>(2 * kI * kH), rng, 0.05f),
                              wd = random_bf16(static_cast<std::size_t>(kH * kI), rng, 0.05f),
                              g1 = random_bf16(static_cast<std::size_t>(kH), rng),
                              attn = random_bf16(static_cast<std::size_t>(m * kH), rng),
                              r0 = random_bf16(static_cast<std::size_t>(m * stride), rng, 2.0f);
  const DeviceBuffer wgu_d = to_device(wgu), wd_d = to_device(wd), g1_d = to_device(g1), attn_d = to_device(attn);
  DeviceBuffer res_d = to_device(r0), out_d(static_cast<std::size_t>(m * kH) * 2);
  auto v = [](const DeviceBuffer& b, int64_t rows, int64_t cols) { return TensorView::bf16(b.get(), rows, cols); };
  TensorView residual = v(res_d, m, kH);
  residual.row_stride = stride;
  const MlpBlockProgram::Weights weights{{}, v(g1_d, 1, kH), v(wgu_d, 2 * kI, kH), v(wd_d, kH, kI), {}, {}, kEps};
  const MlpBlockProgram::Buffers buffers{v(attn_d, m, kH), residual, v(out_d, m, kH)};
  EXPECT_THROW(MlpBlockProgram(weights, buffers, m, true, MlpBlockProgram::Form::kLaunches), InvalidArgument);
  const MlpBlockProgram block(weights, buffers, m);
  EXPECT_EQ(block.form(), MlpBlockProgram::Form::kProgram);
  poison(out_d);
  block.run(nullptr);
  TPD_CUDA(cudaDeviceSynchronize());
  std::vector<uint16_t> packed(static_cast<std::size_t>(m * kH)), got_residual(packed.size());
  const std::vector<uint16_t> res_bits = to_host<uint16_t>(res_d, r0.size());
  for (int t = 0; t < m; ++t)
    for (int64_t c = 0; c < kH; ++c) {
      packed[static_cast<std::size_t>(t * kH + c)] = r0[static_cast<std::size_t>(t * stride + c)];
      got_residual[static_cast<std::size_t>(t * kH + c)] = res_bits[static_cast<std::size_t>(t * stride + c)];
    }
  const std::vector<uint16_t> hn = add_norm(packed, attn, g1, m, kEps);
  const std::vector<uint16_t> act = silu_mul(rounded(gemm_reference(hn, wgu, m, kH, 2 * kI)), m, kI);
  EXPECT_LT(relative_error(to_host<uint16_t>(out_d, static_cast<std::size_t>(m * kH)),
                           gemm_reference(act, wd, m, kI, kH)),
            1e-2)
      << "out";
  EXPECT_LT(relative_error(got_residual, values(packed)), 3e-3) << "residual";
}

TEST(MlpBlockProgram, Refusals) {
  TPD_REQUIRE_GPU();
  const int m = 2;
  DeviceBuffer w(2 * kI * kH * 2), g(kH * 2), attn(m * kH * 2), res(m * kH * 2), out(m * kH * 2);
  auto v = [](const DeviceBuffer& b, int64_t rows, int64_t cols) { return TensorView::bf16(b.get(), rows, cols); };
  const MlpBlockProgram::Weights weights{{}, v(g, 1, kH), v(w, 2 * kI, kH), v(w, kH, kI), {}, {}, kEps};
  EXPECT_NO_THROW(MlpBlockProgram(weights, {v(attn, m, kH), v(res, m, kH), v(out, m, kH)}, m));
  // out overlapping the residual: the program's own check.
  EXPECT_THROW(MlpBlockProgram(weights, {v(attn, m, kH), v(res, m, kH), v(res, m, kH)}, m), InvalidArgument);
  // A hidden width the program's GEMMs do not take (K a multiple of 64).
  const MlpBlockProgram::Weights narrow{{}, v(g, 1, kH - 8), v(w, 2 * kI, kH - 8), v(w, kH - 8, kI), {}, {}, kEps};
  EXPECT_THROW(MlpBlockProgram(narrow, {v(attn, m, kH - 8), v(res, m, kH - 8), v(out, m, kH - 8)}, m),
               InvalidArgument);
}

}  // namespace
}  // namespace tpdecode
