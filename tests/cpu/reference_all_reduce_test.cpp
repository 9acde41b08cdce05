#include <gtest/gtest.h>

#include <vector>

#include "comm/protocol.hpp"
#include "core/bf16.hpp"
#include "reference/all_reduce.hpp"

namespace tpdecode {
namespace {

TEST(ReferenceAllReduce, SumsInRankOrderAndCleansSentinelWords) {
  // Two ranks, one word each: rank 0 sends the sentinel pair (+0, -0) -> (+0, +0).
  std::vector<std::vector<uint16_t>> parts = {{0x0000, 0x8000}, {0x8000, 0x8000}};
  const std::vector<uint16_t> out = reference::all_reduce(parts);
  // low: +0 + -0 = +0; high: cleaned +0 + -0 = +0 (uncleaned it would be -0).
  EXPECT_EQ(out[0], 0x0000);
  EXPECT_EQ(out[1], 0x0000);
  // Without the sentinel pattern, -0 + -0 stays -0.
  parts = {{0x3f80, 0x8000}, {0x3f80, 0x8000}};
  const std::vector<uint16_t> out2 = reference::all_reduce(parts);
  EXPECT_EQ(out2[0], 0x4000);
  EXPECT_EQ(out2[1], 0x8000);
}

TEST(ReferenceAllReduce, ACleanedSumTurnsTheSentinelWordIntoZero) {
  // No partial word is the sentinel, yet the sum is (+0, -0): 1 + -1 = +0 low, -0 + -0 high.
  const std::vector<std::vector<uint16_t>> parts = {{0x3f80, 0x8000, 0x3f80, 0x3f80}, {0xbf80, 0x8000, 0x3f80, 0x3f80}};
  EXPECT_EQ(reference::all_reduce(parts), (std::vector<uint16_t>{0x0000, 0x8000, 0x4000, 0x4000}));
  EXPECT_EQ(reference::all_reduce(parts, true), (std::vector<uint16_t>{0x0000, 0x0000, 0x4000, 0x4000}));
}

TEST(ReferenceAllReduce, AgreesWithTheProtocolFragmentSum) {
  // The device's fragment sum (lamport::sum_rank_order) and the reference agree.
  std::vector<std::vector<uint16_t>> parts(4, std::vector<uint16_t>(8));
  uint32_t x = 12345;
  for (auto& p : parts)
    for (auto& v : p) {
      x = x * 1664525u + 1013904223u;
      v = static_cast<uint16_t>((x >> 16) & 0x7fff) | static_cast<uint16_t>(x & 0x8000);
      if ((v & 0x7f80) == 0x7f80) v &= 0xbfff;  // keep finite
    }
  parts[2][2] = 0x0000;
  parts[2][3] = 0x8000;  // a sentinel word
  lamport::Fragment raw[4];
  for (int r = 0; r < 4; ++r)
    for (int j = 0; j < 4; ++j)
      raw[r].w[j] = lamport::clean(bf16::pack(parts[static_cast<std::size_t>(r)][2 * j], parts[static_cast<std::size_t>(r)][2 * j + 1]));
  const lamport::Fragment sum = lamport::sum_rank_order<4>(raw);
  const std::vector<uint16_t> ref = reference::all_reduce(parts);
  for (int j = 0; j < 4; ++j) EXPECT_EQ(sum.w[j], bf16::pack(ref[2 * j], ref[2 * j + 1])) << j;
}

}  // namespace
}  // namespace tpdecode
