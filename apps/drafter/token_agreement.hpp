// How a path's draft tokens agree with the stock path's: the rows that differ, and
// of those the near ties, where the stock logits of the two tokens lie within
// kNearTieUlps BF16 ulps of the larger (the GPU tests and `tpdecode drafter`).
#pragma once

#include <cstdint>
#include <vector>

namespace tpdecode::drafter {

inline constexpr int kNearTieUlps = 4;

struct TokenAgreement {
  int disagreements = 0;
  int near_ties = 0;
};

// stock_logits: [m, vocab] BF16 bits; the tokens: [m].
TokenAgreement compare_tokens(const std::vector<uint16_t>& stock_logits, const std::vector<int32_t>& stock_tokens,
                              const std::vector<int32_t>& tokens, int64_t vocab);

}  // namespace tpdecode::drafter
