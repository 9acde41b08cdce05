#include "reference/gather.hpp"

#include "comm/protocol.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::reference {

std::vector<uint32_t> gather(std::span<const std::vector<uint32_t>> shards, int64_t rows, int64_t shard_words) {
  const auto tp = static_cast<int64_t>(shards.size());
  require(tp >= 1 && rows >= 1 && shard_words >= 1, "reference gather: empty team or shape");
  std::vector<uint32_t> out(static_cast<std::size_t>(rows * tp * shard_words));
  for (int64_t r = 0; r < tp; ++r) {
    require(static_cast<int64_t>(shards[static_cast<std::size_t>(r)].size()) == rows * shard_words,
            "reference gather: shard size differs from [rows, shard_words]");
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t w = 0; w < shard_words; ++w)
        out[static_cast<std::size_t>((row * tp + r) * shard_words + w)] =
            lamport::clean(shards[static_cast<std::size_t>(r)][static_cast<std::size_t>(row * shard_words + w)]);
  }
  return out;
}

}  // namespace tpdecode::reference
