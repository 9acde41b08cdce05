#include "drafter/token_agreement.hpp"

#include <algorithm>
#include <cmath>

#include "core/bf16.hpp"

namespace tpdecode::drafter {

namespace {

// One BF16 ulp at |v| (normal numbers).
float bf16_ulp(float v) {
  const float a = std::max(std::abs(v), 1e-30f);
  return std::ldexp(1.0f, static_cast<int>(std::floor(std::log2(a))) - 7);
}

}  // namespace

TokenAgreement compare_tokens(const std::vector<uint16_t>& stock_logits, const std::vector<int32_t>& stock_tokens,
                              const std::vector<int32_t>& tokens, int64_t vocab) {
  TokenAgreement a;
  const auto v = static_cast<std::size_t>(vocab);
  for (std::size_t row = 0; row < tokens.size(); ++row) {
    if (stock_tokens[row] == tokens[row]) continue;
    ++a.disagreements;
    const float top = bf16::to_float(stock_logits[row * v + static_cast<std::size_t>(stock_tokens[row])]);
    const float other = bf16::to_float(stock_logits[row * v + static_cast<std::size_t>(tokens[row])]);
    if (top - other <= kNearTieUlps * bf16_ulp(top)) ++a.near_ties;
  }
  return a;
}

}  // namespace tpdecode::drafter
