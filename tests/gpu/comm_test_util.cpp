#include "gpu/comm_test_util.hpp"

#include "tpdecode/bf16.hpp"

namespace tpdecode::test {

namespace {

void plant_sentinels(std::vector<uint16_t>& v, std::mt19937_64& rng) {
  std::uniform_int_distribution<std::size_t> pick(0, v.size() / 2 - 1);
  for (int n = 0; n < 3; ++n) {
    const std::size_t w = pick(rng);
    v[2 * w] = 0x0000;
    v[2 * w + 1] = 0x8000;
  }
}

}  // namespace

ArNormIo ArNormCase::io(int rank) const {
  const auto k = static_cast<std::size_t>(rank);
  ArNormIo io;
  io.x = TensorView::bf16(x[k].get(), rows, hidden);
  if (residual) io.residual = TensorView::bf16(res[k].get(), rows, hidden);
  io.weight = TensorView::bf16(weight.get(), 1, hidden);
  io.eps = eps;
  io.out = TensorView::bf16(out[k].get(), rows, hidden);
  io.residual_out = TensorView::bf16(res_out[k].get(), rows, hidden);
  return io;
}

reference::ArNormResult ArNormCase::reference() const {
  return reference::ar_norm(x_host, residual_host, weight_host, eps, hidden);
}

ArNormCase make_ar_norm_case(int ranks, int rows, int hidden, bool residual, std::mt19937_64& rng) {
  ArNormCase c;
  c.ranks = ranks;
  c.rows = rows;
  c.hidden = hidden;
  c.residual = residual;
  const std::size_t n = static_cast<std::size_t>(rows) * hidden;
  if (residual) c.residual_host = random_bf16(n, rng, 4.0f);
  c.weight_host = random_bf16(static_cast<std::size_t>(hidden), rng, 0.5f);
  c.weight = to_device(c.weight_host);
  for (int k = 0; k < ranks; ++k) {
    c.x_host.push_back(random_bf16(n, rng));
    plant_sentinels(c.x_host.back(), rng);
    c.x.push_back(to_device(c.x_host.back()));
    c.res.push_back(residual ? to_device(c.residual_host) : DeviceBuffer(16));
    c.out.emplace_back(n * 2);
    c.res_out.emplace_back(n * 2);
    poison(c.out.back());
    poison(c.res_out.back());
  }
  return c;
}

ArNormCheck check_ar_norm(const ArNormCase& c) {
  const reference::ArNormResult ref = c.reference();
  const std::size_t n = ref.out.size();
  ArNormCheck r;
  std::vector<uint16_t> out0, res0;
  for (int k = 0; k < c.ranks; ++k) {
    const std::vector<uint16_t> out = to_host<uint16_t>(c.out[static_cast<std::size_t>(k)], n);
    const std::vector<uint16_t> res = to_host<uint16_t>(c.res_out[static_cast<std::size_t>(k)], n);
    for (std::size_t i = 0; i < n; ++i) {
      r.residual_mismatches += res[i] != ref.residual_out[i];
      r.out_over_one_ulp += bf16::ulp_distance(out[i], ref.out[i]) > 1;
      r.out_exact += out[i] == ref.out[i];
      ++r.out_total;
    }
    if (k == 0) {
      out0 = out;
      res0 = res;
    } else {
      r.ranks_differing += out != out0 || res != res0;
    }
  }
  return r;
}

std::vector<uint32_t> random_words(std::size_t n, std::mt19937_64& rng) {
  std::vector<uint32_t> v(n);
  for (auto& w : v) w = static_cast<uint32_t>(rng());
  std::uniform_int_distribution<std::size_t> pick(0, n - 1);
  for (int k = 0; k < 3; ++k) v[pick(rng)] = 0x80000000u;
  return v;
}

}  // namespace tpdecode::test
