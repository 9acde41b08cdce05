#include "gpu/oproj_cases.hpp"

#include <cmath>

#include "core/bf16.hpp"
#include "reference/all_reduce.hpp"
#include "reference/gemm.hpp"
#include "tpdecode/decode_gemm.hpp"

namespace tpdecode::test {

namespace {

constexpr float kEps = 1e-6f;

std::size_t n(int64_t rows, int64_t cols) { return static_cast<std::size_t>(rows * cols); }

// 1 + 0.1 · N(0, 1): norm weights.
std::vector<uint16_t> near_one(std::size_t count, std::mt19937_64& rng) {
  std::vector<uint16_t> v = random_bf16(count, rng, 0.1f);
  for (auto& x : v) x = bf16::from_float(1.0f + bf16::to_float(x));
  return v;
}

TensorView view(const DeviceBuffer& d, int64_t rows, int64_t cols) {
  return TensorView::bf16(const_cast<void*>(d.get()), rows, cols);
}

}  // namespace

OprojCase::OprojCase(const Team& team, const OprojShapeArgs& shape, uint64_t seed) : s_(shape), ranks_(team.size()) {
  const int m = s_.m;
  const int64_t h = s_.hidden, k = s_.k;
  device_ = team.device(0);
  TPD_CUDA(cudaSetDevice(device_));
  std::mt19937_64 rng(seed ^ 0x0b0bull);
  // Why 1/sqrt(K): unit-variance partials, as the drafter's weights give.
  for (int r = 0; r < ranks_; ++r) w_.push_back(random_bf16(n(h, k), rng, 1.0f / std::sqrt(static_cast<float>(k))));
  residual_ = random_bf16(n(m, h), rng, 4.0f);
  norm_ = random_bf16(static_cast<std::size_t>(h), rng, 0.5f);
  partial_ = random_bf16(n(m, h), rng);
  blocks_ = random_bf16(n(static_cast<int64_t>(s_.nb) * m, h), rng, 1.5f);
  g_ = near_one(static_cast<std::size_t>(h), rng);
  q_ = random_bf16(static_cast<std::size_t>(h), rng, 1.0f / 32);  // logits of O(1): no one-hot softmax
  w_out_ = near_one(static_cast<std::size_t>(h), rng);
  g_next_ = near_one(static_cast<std::size_t>(h), rng);
  q_next_ = random_bf16(static_cast<std::size_t>(h), rng, 1.0f / 32);
  draw_x(seed);

  residual_d_ = to_device(residual_);
  norm_d_ = to_device(norm_);
  partial_d_ = to_device(partial_);
  blocks_d_ = DeviceBuffer(std::max<std::size_t>(blocks_.size() * 2, 16));
  if (!blocks_.empty()) upload(blocks_d_, blocks_.data(), blocks_.size() * 2);
  g_d_ = to_device(g_);
  q_d_ = to_device(q_);
  w_out_d_ = to_device(w_out_);
  g_next_d_ = to_device(g_next_);
  q_next_d_ = to_device(q_next_);
  for (int i = 0; i < team.driven(); ++i) {
    const auto rank = static_cast<std::size_t>(team.rank(i));
    streams_.push_back(team.stream(i));
    x_d_.push_back(to_device(x_[rank]));
    w_d_.push_back(to_device(w_[rank]));
    first_.emplace_back(n(m, h) * 2);
    out_.emplace_back(n(m, h) * 2);
    stats_.emplace_back(n(m, 2) * 4);
    mixture_.emplace_back(n(m, h) * 4);
    OprojArNormIo a;
    a.x = view(x_d_.back(), m, k);
    a.residual = view(residual_d_, m, h);
    a.weight = view(norm_d_, 1, h);
    a.eps = kEps;
    a.out = view(out_.back(), m, h);
    a.residual_out = view(first_.back(), m, h);
    ar_io_.push_back(a);
    OprojAttnResIo t;
    t.x = a.x;
    t.partial = view(partial_d_, m, h);
    t.partial_out = view(first_.back(), m, h);
    if (s_.nb > 0) t.blocks = view(blocks_d_, static_cast<int64_t>(s_.nb) * m, h);
    t.new_block = s_.new_block;
    t.key_norm = view(g_d_, 1, h);
    t.query = view(q_d_, 1, h);
    t.out_norm = view(w_out_d_, 1, h);
    t.eps = kEps;
    t.out = a.out;
    if (s_.ahead)
      t.ahead = AttnResAhead{view(g_next_d_, 1, h), view(q_next_d_, 1, h), kEps,
                             TensorView::f32(stats_.back().get(), m, 2), TensorView::f32(mixture_.back().get(), m, h)};
    attn_io_.push_back(t);
  }
  TPD_CUDA(cudaDeviceSynchronize());
}

void OprojCase::draw_x(uint64_t seed) {
  std::mt19937_64 rng(seed);
  x_.clear();
  for (int r = 0; r < ranks_; ++r) x_.push_back(random_bf16(n(s_.m, s_.k), rng));
}

void OprojCase::refill_x(const Team& team, uint64_t seed) {
  draw_x(seed);
  TPD_CUDA(cudaSetDevice(device_));
  for (int i = 0; i < team.driven(); ++i)
    upload(x_d_[static_cast<std::size_t>(i)], x_[static_cast<std::size_t>(team.rank(i))].data(), n(s_.m, s_.k) * 2);
  TPD_CUDA(cudaDeviceSynchronize());
}

std::vector<TensorView> OprojCase::weights() const {
  std::vector<TensorView> w;
  for (const DeviceBuffer& d : w_d_) w.push_back(view(d, s_.hidden, s_.k));
  return w;
}

OprojResult OprojCase::run(PreparedOproj& op) {
  TPD_CUDA(cudaSetDevice(device_));
  for (std::size_t i = 0; i < streams_.size(); ++i) {
    poison(first_[i], streams_[i]);
    poison(out_[i], streams_[i]);
    poison(stats_[i], streams_[i]);
    poison(mixture_[i], streams_[i]);
  }
  if (s_.epilogue == OprojEpilogue::kArNorm) return op.run(ar_io_, streams_);
  return op.run(attn_io_, streams_);
}

OprojOutputs OprojCase::outputs(int driven) const {
  TPD_CUDA(cudaSetDevice(device_));
  const auto i = static_cast<std::size_t>(driven);
  OprojOutputs o;
  o.first = to_host<uint16_t>(first_[i], rows_elements());
  o.out = to_host<uint16_t>(out_[i], rows_elements());
  if (s_.ahead) {
    o.stats = to_host<float>(stats_[i], n(s_.m, 2));
    o.mixture = to_host<float>(mixture_[i], rows_elements());
  }
  return o;
}

OprojOutputs OprojCase::reference_from(const std::vector<std::vector<uint16_t>>& partials) const {
  const std::vector<uint16_t> reduced = reference::all_reduce(partials);
  OprojOutputs o;
  if (s_.epilogue == OprojEpilogue::kArNorm) {
    reference::ArNormResult r = reference::add_rms_norm(reduced, residual_, norm_, kEps, s_.hidden);
    o.first = std::move(r.residual_out);
    o.out = std::move(r.out);
    return o;
  }
  reference::AttnResRows r =
      reference::attn_res(reduced, partial_, s_.new_block, blocks_, s_.nb, {g_, q_, w_out_, kEps}, s_.hidden);
  o.first = std::move(r.partial_out);
  o.out = std::move(r.out);
  if (s_.ahead) {
    reference::AttnResStats a = reference::attn_res_ahead(blocks_, s_.nb, s_.m, g_next_, q_next_, kEps, s_.hidden);
    o.stats = std::move(a.stats);
    o.mixture = std::move(a.mixture);
  }
  return o;
}

OprojOutputs OprojCase::fp64_reference() const {
  std::vector<std::vector<uint16_t>> partials;
  for (int r = 0; r < ranks_; ++r)
    partials.push_back(reference::gemm_bf16_rounded(x_[static_cast<std::size_t>(r)], w_[static_cast<std::size_t>(r)],
                                                    s_.m, s_.hidden, s_.k));
  return reference_from(partials);
}

OprojOutputs OprojCase::gpu_partials_reference(int split) const {
  TPD_CUDA(cudaSetDevice(device_));
  std::vector<std::vector<uint16_t>> partials;
  for (int r = 0; r < ranks_; ++r) {
    const DeviceBuffer w = to_device(w_[static_cast<std::size_t>(r)]);
    const DeviceBuffer x = to_device(x_[static_cast<std::size_t>(r)]);
    DeviceBuffer out(rows_elements() * 2);
    DecodeGemm gemm(view(w, s_.hidden, s_.k));
    gemm.force(s_.m, warp_decision(split));
    gemm.run(view(x, s_.m, s_.k), view(out, s_.m, s_.hidden), nullptr);
    TPD_CUDA(cudaDeviceSynchronize());
    partials.push_back(to_host<uint16_t>(out, rows_elements()));
  }
  return reference_from(partials);
}

int count_beyond(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, int ulps, float scale) {
  // One BF16 ulp at `scale`: 2^(exponent - 7).
  const float absolute = scale > 0.0f ? static_cast<float>(ulps) * std::ldexp(1.0f, std::ilogb(scale) - 7) : 0.0f;
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool nan = (got[i] & 0x7f80) == 0x7f80 && (got[i] & 0x7f) != 0;
    const bool far = bf16::ulp_distance(got[i], want[i]) > ulps &&
                     !(std::abs(bf16::to_float(got[i]) - bf16::to_float(want[i])) <= absolute);
    bad += nan || far;
  }
  return bad;
}

bool all_nan(const std::vector<uint16_t>& v) {
  for (uint16_t x : v)
    if ((x & 0x7f80) != 0x7f80 || (x & 0x7f) == 0) return false;
  return true;
}

}  // namespace tpdecode::test
