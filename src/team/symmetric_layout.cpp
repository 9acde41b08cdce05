#include "team/symmetric_layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.hpp"

namespace tpdecode {

namespace {

std::string describe(const SymmetricLayout& l) {
  const std::string_view what(l.what, strnlen(l.what, sizeof l.what));
  return fmt::format("allocation {}: {} ({} B, filled with 0x{:08x})", l.sequence, what, l.bytes, l.fill_word);
}

}  // namespace

SymmetricLayout symmetric_layout(uint64_t sequence, uint64_t bytes, uint32_t fill_word, std::string_view what) {
  SymmetricLayout l;
  l.sequence = sequence;
  l.bytes = bytes;
  l.fill_word = fill_word;
  std::memcpy(l.what, what.data(), std::min(what.size(), sizeof l.what - 1));
  l.what_hash = 0xcbf29ce484222325ull;  // FNV-1a
  for (const char c : what) l.what_hash = (l.what_hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return l;
}

void check_layouts_agree(std::span<const SymmetricLayout> ranks) {
  std::vector<int> other;
  for (std::size_t r = 1; r < ranks.size(); ++r)
    if (!(ranks[r] == ranks[0])) other.push_back(static_cast<int>(r));
  if (other.empty()) return;
  std::string lines;
  for (const int r : other) lines += fmt::format("; rank {}: {}", r, describe(ranks[static_cast<std::size_t>(r)]));
  throw InvalidArgument(fmt::format(
      "the ranks' symmetric buffers differ (rank 0: {}{}): every rank must build the same tpdecode objects (configs, "
      "row counts, widths) in the same order; this allocation was not made (the object's earlier ones, alike on "
      "every rank, stay until the team goes)",
      describe(ranks[0]), lines));
}

}  // namespace tpdecode
