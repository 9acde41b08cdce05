// CPU reference of the one-shot all-reduce, bit for bit: each rank's partial is
// sent cleaned (a word equal to the mailbox sentinel, BF16 pair (+0, -0), as 0),
// then summed in FP32 in rank order starting from rank 0's value, rounded once.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tpdecode::reference {

// partials[r] holds rank r's [rows, cols] BF16 bits (cols even); returns the
// reduced [rows, cols]. clean_sum: a reduced word equal to the sentinel arrives as 0
// too (what the two-shot gives, and every path of a batch-invariant TpComm).
std::vector<uint16_t> all_reduce(std::span<const std::vector<uint16_t>> partials, bool clean_sum = false);

}  // namespace tpdecode::reference
