// CPU reference of Gather: rank r's [rows, S] words land at columns r·S ... of the
// [rows, TP·S] output; a word equal to the mailbox sentinel (BF16 pair +0, -0)
// arrives as 0, the only change.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tpdecode::reference {

std::vector<uint32_t> gather(std::span<const std::vector<uint32_t>> shards, int64_t rows, int64_t shard_words);

}  // namespace tpdecode::reference
