#include "reference/fp8_quant.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/bf16.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::reference {

uint8_t e4m3_from_float(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7f;
  const float a = std::fabs(x);
  // Why >= 448 at once: every value above rounds to 448 or to 480, which does not
  // exist (satfinite); 464, the midpoint, ties to 448's even mantissa.
  if (a >= kE4m3Max) return sign | 0x7e;
  if (a < 0x1p-6f) {
    // Subnormal: units of 2^-9, rounded to nearest even (8 units is 2^-6, the
    // smallest normal, whose bits 0x08 follow on).
    const float units = std::nearbyint(a * 0x1p9f);  // exact scaling; FE_TONEAREST
    return sign | static_cast<uint8_t>(units);
  }
  int e = 0;
  std::frexp(a, &e);  // a = f · 2^e, f in [0.5, 1): a's binade is 2^(e-1)
  const int exponent = e - 1;
  // The significand in eighths, [8, 16), rounded to nearest even (16: the next binade).
  int eighths = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - exponent)));
  int biased = exponent + 7;
  if (eighths == 16) {
    eighths = 8;
    ++biased;
  }
  return sign | static_cast<uint8_t>((biased << 3) | (eighths - 8));
}

float float_from_e4m3(uint8_t bits) {
  const int exponent = (bits >> 3) & 0xf;
  const int mantissa = bits & 0x7;
  float v = 0.0f;
  if (exponent == 0xf && mantissa == 0x7)
    v = std::numeric_limits<float>::quiet_NaN();
  else if (exponent == 0)
    v = std::ldexp(static_cast<float>(mantissa), -9);
  else
    v = std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  return (bits & 0x80) ? -v : v;
}

std::vector<uint8_t> quantise_static(std::span<const uint16_t> v, float scale) {
  const float inv = 1.0f / scale;
  std::vector<uint8_t> q(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) q[i] = e4m3_from_float(bf16::to_float(v[i]) * inv);
  return q;
}

float group_scale(float amax, bool ue8m0) {
  if (!(amax >= kGroupAmaxFloor) && !std::isnan(amax)) amax = kGroupAmaxFloor;
  float scale = amax / kE4m3Max;
  if (ue8m0 && std::isfinite(scale)) {
    int e = 0;
    const float f = std::frexp(scale, &e);  // scale = f · 2^e, f in [0.5, 1)
    scale = f == 0.5f ? scale : std::ldexp(1.0f, e);
  }
  return scale;
}

GroupQuant quantise_groups(std::span<const uint16_t> v, int64_t hidden, bool ue8m0) {
  require(hidden > 0 && hidden % kQuantGroup == 0 && v.size() % static_cast<std::size_t>(hidden) == 0,
          fmt::format("reference quantise_groups: {} values of rows of {} (a multiple of {})", v.size(), hidden,
                      kQuantGroup));
  GroupQuant g;
  g.q.resize(v.size());
  const auto group = static_cast<std::size_t>(kQuantGroup);
  for (std::size_t first = 0; first < v.size(); first += group) {
    float amax = 0.0f;
    for (std::size_t i = first; i < first + group; ++i) {
      const float a = std::fabs(bf16::to_float(v[i]));
      amax = std::isnan(a) || std::isnan(amax) ? std::numeric_limits<float>::quiet_NaN() : std::max(amax, a);
    }
    const float scale = group_scale(amax, ue8m0);
    g.scales.push_back(scale);
    for (std::size_t i = first; i < first + group; ++i) g.q[i] = e4m3_from_float(bf16::to_float(v[i]) / scale);
  }
  return g;
}

}  // namespace tpdecode::reference
