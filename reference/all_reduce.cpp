#include "reference/all_reduce.hpp"

#include "core/bf16.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::reference {

namespace {

// The mailbox's clean on BF16 pairs: the word (+0, -0) sent as (+0, +0).
void clean_words(std::vector<uint16_t>& v) {
  for (std::size_t i = 0; i + 1 < v.size(); i += 2)
    if (v[i] == 0x0000 && v[i + 1] == 0x8000) v[i + 1] = 0x0000;
}

}  // namespace

std::vector<uint16_t> all_reduce(std::span<const std::vector<uint16_t>> partials, bool clean_sum) {
  require(!partials.empty(), "reference all_reduce: no partials");
  const std::size_t n = partials[0].size();
  require(n % 2 == 0, "reference all_reduce: odd element count");
  std::vector<std::vector<uint16_t>> sent(partials.size());
  std::vector<const uint16_t*> ptrs;
  for (std::size_t r = 0; r < partials.size(); ++r) {
    require(partials[r].size() == n, "reference all_reduce: partials differ in size");
    sent[r] = partials[r];
    clean_words(sent[r]);
    ptrs.push_back(sent[r].data());
  }
  std::vector<uint16_t> out(n);
  bf16::reduce_rank_order(ptrs, out);
  if (clean_sum) clean_words(out);
  return out;
}

}  // namespace tpdecode::reference
