// draft_logits: shard GEMM, the caller's gather, slice + soft cap + scale, one
// FP32 epilogue rounding; graph-capturable.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/bf16.hpp"
#include "gpu/gpu_test_util.hpp"
#include "tpdecode/draft_logits.hpp"

namespace tpdecode {
namespace {

using test::DeviceBuffer;

// A stand-in gather for TP ranks that all hold the same shard: copies it into each
// rank's column block (the real ones are DrafterComm::gather_logits / the stock gather).
LogitsGather replicate(int tp) {
  return [tp](const TensorView& shard, const TensorView& gathered, cudaStream_t stream) {
    for (int r = 0; r < tp; ++r)
      TPD_CUDA(cudaMemcpy2DAsync(gathered.as<uint16_t>() + r * shard.cols, gathered.row_stride * 2, shard.data,
                                 shard.row_stride * 2, shard.cols * 2, shard.rows, cudaMemcpyDeviceToDevice, stream));
  };
}

float epilogue_of(uint16_t logit, const LogitsEpilogue& e) {
  float y = bf16::to_float(logit);
  if (e.soft_cap > 0) y = std::tanh(y / e.soft_cap) * e.soft_cap;
  return y * e.scale;
}

void check(int tp, const LogitsEpilogue& e, int m, std::mt19937_64& rng) {
  SCOPED_TRACE(testing::Message() << "TP " << tp << " vocab " << e.vocab << " cap " << e.soft_cap << " M " << m);
  const int64_t shard_n = 2048, hidden = 1024;
  DeviceBuffer w = test::to_device(test::random_bf16(static_cast<std::size_t>(shard_n * hidden), rng, 0.05f));
  DeviceBuffer x = test::to_device(test::random_bf16(static_cast<std::size_t>(m * hidden), rng));
  DeviceBuffer shard(static_cast<std::size_t>(m * shard_n) * 2), gathered(shard.bytes() * tp);
  DeviceBuffer out(static_cast<std::size_t>(m * e.vocab) * 2);
  test::poison(out);
  DecodeGemm head(TensorView::bf16(w.get(), shard_n, hidden));
  const TensorView sv = TensorView::bf16(shard.get(), m, shard_n);
  const TensorView gv = tp == 1 ? sv : TensorView::bf16(gathered.get(), m, tp * shard_n);
  draft_logits(head, TensorView::bf16(x.get(), m, hidden), sv, tp == 1 ? LogitsGather{} : replicate(tp), gv, e,
               TensorView::bf16(out.get(), m, e.vocab), nullptr);
  TPD_CUDA(cudaDeviceSynchronize());
  const auto logits = test::to_host<uint16_t>(shard, static_cast<std::size_t>(m * shard_n));
  const auto got = test::to_host<uint16_t>(out, static_cast<std::size_t>(m * e.vocab));
  int worst = 0;
  for (int r = 0; r < m; ++r)
    for (int64_t c = 0; c < e.vocab; ++c) {
      const uint16_t want = bf16::from_float(epilogue_of(logits[r * shard_n + c % shard_n], e));
      worst = std::max(worst, bf16::ulp_distance(got[r * e.vocab + c], want));
    }
  // Device tanhf may differ from the host's in the last FP32 bits: 1 BF16 ulp at most.
  EXPECT_LE(worst, e.soft_cap > 0 ? 1 : 0);
}

TEST(DraftLogits, SliceCapScale) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(test::fresh_seed());
  check(1, {2000, 0.0f, 1.0f}, 3, rng);
  check(1, {2048, 30.0f, 0.5f}, 8, rng);
  check(4, {8000, 0.0f, 1.0f}, 16, rng);
  check(4, {7777, 15.0f, 1.25f}, 32, rng);
  check(2, {4096, 0.0f, 2.0f}, 40, rng);  // M > 32: the GEMM runs on cuBLAS
}

TEST(DraftLogits, BadBuffersAreRefused) {
  TPD_REQUIRE_GPU();
  DeviceBuffer w(256 * 128 * 2), x(2 * 128 * 2), shard(2 * 256 * 2), out(2 * 300 * 2);
  DecodeGemm head(TensorView::bf16(w.get(), 256, 128));
  const TensorView xv = TensorView::bf16(x.get(), 2, 128);
  const TensorView sv = TensorView::bf16(shard.get(), 2, 256);
  // vocab beyond the gathered columns; no gather but a separate gathered buffer.
  EXPECT_THROW(draft_logits(head, xv, sv, {}, sv, {300, 0, 1}, TensorView::bf16(out.get(), 2, 300), nullptr),
               InvalidArgument);
  EXPECT_THROW(draft_logits(head, xv, sv, {}, TensorView::bf16(out.get(), 2, 256), {200, 0, 1},
                            TensorView::bf16(out.get(), 2, 200), nullptr),
               InvalidArgument);
  // A cap or scale that is not finite (an infinite cap would give 0 * inf = NaN).
  const TensorView ov = TensorView::bf16(out.get(), 2, 200);
  EXPECT_THROW(draft_logits(head, xv, sv, {}, sv, {200, INFINITY, 1}, ov, nullptr), InvalidArgument);
  EXPECT_THROW(draft_logits(head, xv, sv, {}, sv, {200, 0, NAN}, ov, nullptr), InvalidArgument);
  // out over the logits it reads: the epilogue's threads would race on them.
  const TensorView over_shard{shard.get(), DType::kBF16, 2, 200, 256};
  EXPECT_THROW(draft_logits(head, xv, sv, {}, sv, {200, 0, 1}, over_shard, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace tpdecode
