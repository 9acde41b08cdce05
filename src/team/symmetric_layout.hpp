// What one symmetric allocation is on one rank, compared across the ranks before it
// is made. Why: every rank must build the same tpdecode objects (configs, row
// counts, widths) in the same order; an NCCL team's ranks in other processes build
// theirs apart, and a rank that built another object would lay its copy out
// otherwise, so its peers' stores would land on other data.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

namespace tpdecode {

struct SymmetricLayout {
  uint64_t sequence = 0;  // the team's symmetric allocations before this one
  uint64_t bytes = 0;
  uint32_t fill_word = 0;
  char what[100] = {};     // what the caller lays out in it (a mailbox's owner and shape), NUL-padded, cut
  uint64_t what_hash = 0;  // of the whole text: a cut text still compares all of it
  bool operator==(const SymmetricLayout&) const = default;
};
static_assert(sizeof(SymmetricLayout) == 128 && std::is_trivially_copyable_v<SymmetricLayout>);

// `what` is kept whole as its hash and cut to 99 characters as text.
SymmetricLayout symmetric_layout(uint64_t sequence, uint64_t bytes, uint32_t fill_word, std::string_view what);

// Throws InvalidArgument naming the ranks whose layout differs from rank 0's and
// both layouts, unless all of `ranks` (rank order) agree. Every rank sees the same
// `ranks`, so every rank throws alike: none is left waiting in a collective.
void check_layouts_agree(std::span<const SymmetricLayout> ranks);

}  // namespace tpdecode
