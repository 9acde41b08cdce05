// What a TeamProgram (team_program.hpp) gives each driven rank's GemmProgram: the
// team as that rank's kernels see it, the programs' team mailbox, and the CTAs the
// rank may hold; and where each all-reduce op's columns sit in the mailbox's rows.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/protocol.hpp"
#include "tpdecode/gemm_program.hpp"

namespace tpdecode::program {

struct TeamBinding {
  lamport::TeamRef team{};
  lamport::MailboxRef box{};
  int ctas = 0;  // the program's CTAs: the SMs this rank owns on its GPU
};

// Per op, the first 16-byte fragment of its window of the team mailbox's rows (-1:
// not an all-reduce); the windows in op order, back to back. `fragments_total`: the
// row's fragments.
inline std::vector<int64_t> team_windows(const std::vector<GemmProgram::Op>& ops, int64_t* fragments_total) {
  std::vector<int64_t> first;
  int64_t next = 0;
  for (const GemmProgram::Op& op : ops) {
    const bool reduces = op.is_norm && op.norm.all_reduce;
    first.push_back(reduces ? next : -1);
    if (reduces) next += op.norm.x.cols / 8;
  }
  *fragments_total = next;
  return first;
}

}  // namespace tpdecode::program
