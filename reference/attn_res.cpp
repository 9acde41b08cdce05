#include "reference/attn_res.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/bf16.hpp"
#include "reference/ar_norm.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::reference {
namespace {

float f(uint16_t b) { return bf16::to_float(b); }

std::vector<float> floats(std::span<const uint16_t> v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = f(v[i]);
  return out;
}

// u_c = g_c · q_c.
std::vector<float> products(std::span<const uint16_t> g, std::span<const uint16_t> q) {
  std::vector<float> u(g.size());
  for (std::size_t c = 0; c < g.size(); ++c) u[c] = f(g[c]) * f(q[c]);
  return u;
}

// s = (rowsum fma(v, u)) · rstd(rowsum fma(v, v)).
float logit(std::span<const float> v, std::span<const float> u, float eps) {
  return row_dot(v, u) * ar_norm_rstd(row_dot(v, v), static_cast<int64_t>(v.size()), eps);
}

std::span<const float> row_of(const std::vector<float>& v, std::size_t row, std::size_t h) {
  return std::span<const float>(v).subspan(row * h, h);
}

}  // namespace

AttnResRows attn_res(std::span<const uint16_t> y, std::span<const uint16_t> partial, bool new_block,
                     std::span<const uint16_t> blocks, int nb, const AttnResWeights& w, int64_t hidden) {
  const auto h = static_cast<std::size_t>(hidden);
  require(hidden > 0 && y.size() % h == 0, "reference attn_res: y is not whole rows");
  const std::size_t rows = y.size() / h;
  require(blocks.size() == static_cast<std::size_t>(nb) * rows * h && (new_block || partial.size() == y.size()),
          "reference attn_res: block or partial sizes do not match");
  AttnResRows r;
  r.partial_out.resize(y.size());
  for (std::size_t i = 0; i < y.size(); ++i)
    r.partial_out[i] = new_block ? y[i] : bf16::from_float(f(y[i]) + f(partial[i]));
  const std::vector<float> u = products(w.key_norm, w.query);
  const std::vector<float> saved = floats(blocks);
  const std::vector<float> fresh = floats(r.partial_out);
  r.out.resize(y.size());
  r.mixed.resize(y.size());
  for (std::size_t row = 0; row < rows; ++row) {
    std::vector<std::span<const float>> src;  // v_0 .. v_{nb-1}, then p'
    for (int i = 0; i < nb; ++i) src.push_back(row_of(saved, static_cast<std::size_t>(i) * rows + row, h));
    src.push_back(row_of(fresh, row, h));
    std::vector<float> e(src.size());
    float mx = -std::numeric_limits<float>::infinity();
    for (std::size_t i = 0; i < src.size(); ++i) mx = std::fmax(mx, e[i] = logit(src[i], u, w.eps));
    float z = 0.0f;
    for (std::size_t i = 0; i < src.size(); ++i) {
      e[i] = std::exp(e[i] - mx);
      z = i == 0 ? e[i] : z + e[i];
    }
    std::span<float> hrow(r.mixed.data() + row * h, h);
    std::fill(hrow.begin(), hrow.end(), 0.0f);
    for (std::size_t i = 0; i < src.size(); ++i) {
      const float a = e[i] / z;
      for (std::size_t c = 0; c < h; ++c) hrow[c] = std::fma(a, src[i][c], hrow[c]);
    }
    const float rstd = ar_norm_rstd(row_dot(hrow, hrow), hidden, w.eps);
    for (std::size_t c = 0; c < h; ++c) r.out[row * h + c] = bf16::from_float((hrow[c] * rstd) * f(w.out_norm[c]));
  }
  return r;
}

AttnResStats attn_res_ahead(std::span<const uint16_t> blocks, int nb, int rows, std::span<const uint16_t> key_norm,
                            std::span<const uint16_t> query, float eps, int64_t hidden) {
  const auto h = static_cast<std::size_t>(hidden);
  require(nb >= 1 && blocks.size() == static_cast<std::size_t>(nb * rows) * h,
          "reference attn_res_ahead: needs nb >= 1 saved blocks of [rows, hidden]");
  const std::vector<float> u = products(key_norm, query);
  const std::vector<float> saved = floats(blocks);
  AttnResStats s;
  s.stats.resize(static_cast<std::size_t>(rows) * 2);
  s.mixture.assign(static_cast<std::size_t>(rows) * h, 0.0f);
  for (std::size_t row = 0; row < static_cast<std::size_t>(rows); ++row) {
    std::vector<float> e(static_cast<std::size_t>(nb));
    float mx = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < nb; ++i)
      mx = std::fmax(mx, e[static_cast<std::size_t>(i)] = logit(row_of(saved, i * rows + row, h), u, eps));
    float den = 0.0f;
    for (int i = 0; i < nb; ++i) {
      float& ei = e[static_cast<std::size_t>(i)];
      ei = std::exp(ei - mx);
      den = i == 0 ? ei : den + ei;
      const std::span<const float> v = row_of(saved, i * rows + row, h);
      for (std::size_t c = 0; c < h; ++c) s.mixture[row * h + c] = std::fma(ei, v[c], s.mixture[row * h + c]);
    }
    s.stats[2 * row] = mx;
    s.stats[2 * row + 1] = den;
  }
  return s;
}

std::vector<float> attn_res_merge(const AttnResStats& ahead, std::span<const uint16_t> partial,
                                  std::span<const uint16_t> key_norm, std::span<const uint16_t> query, float eps,
                                  int64_t hidden) {
  const auto h = static_cast<std::size_t>(hidden);
  const std::size_t rows = ahead.stats.size() / 2;
  require(partial.size() == rows * h && ahead.mixture.size() == rows * h, "reference attn_res_merge: sizes");
  const std::vector<float> u = products(key_norm, query);
  const std::vector<float> p = floats(partial);
  std::vector<float> out(rows * h);
  for (std::size_t row = 0; row < rows; ++row) {
    const float mx = ahead.stats[2 * row];
    const float den = ahead.stats[2 * row + 1];
    const float s = logit(row_of(p, row, h), u, eps);
    const float top = std::fmax(mx, s);
    const float a = std::exp(mx - top);
    const float b = std::exp(s - top);
    const float z = den * a + b;
    for (std::size_t c = 0; c < h; ++c) out[row * h + c] = (ahead.mixture[row * h + c] * a + b * p[row * h + c]) / z;
  }
  return out;
}

}  // namespace tpdecode::reference
