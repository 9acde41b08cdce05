// The rotation rule of every timed graph: enough copies that no call finds its weight
// in L2, and graphs of whole rotations, so that back-to-back replays never read one
// copy twice in a row.
#include <gtest/gtest.h>

#include "core/weight_rotation.hpp"

namespace tpdecode {
namespace {

constexpr std::size_t kL2 = 60u << 20;  // an H200's

TEST(WeightRotation, CopiesTotalFiveL2sWithinTheCap) {
  EXPECT_EQ(weight_copies(132u << 20, kL2), 3);   // 396 MB >= 300 MB
  EXPECT_EQ(weight_copies(300u << 20, kL2), 1);
  EXPECT_EQ(weight_copies(1u << 30, kL2), 1);
  EXPECT_EQ(weight_copies(30u << 20, kL2), 10);
  EXPECT_EQ(weight_copies(1u << 10, kL2), kMaxWeightCopies);
  EXPECT_EQ(weight_copies(0, kL2), kMaxWeightCopies);
}

TEST(WeightRotation, GraphsHoldWholeRotations) {
  EXPECT_EQ(rotation_calls(3, 4), 6);  // not 4: copy 0 would end one replay and begin the next
  EXPECT_EQ(rotation_calls(3, 10), 12);
  EXPECT_EQ(rotation_calls(3, 6), 6);
  EXPECT_EQ(rotation_calls(10, 4), 10);  // one rotation at least
  EXPECT_EQ(rotation_calls(1, 4), 4);
  EXPECT_EQ(rotation_calls(0, 4), 4);
  for (int copies = 1; copies <= kMaxWeightCopies; ++copies)
    for (int at_least : {1, 4, 10, 64}) {
      const int calls = rotation_calls(copies, at_least);
      EXPECT_EQ(calls % copies, 0) << copies << " " << at_least;
      EXPECT_GE(calls, at_least);
      EXPECT_LT(calls - copies, std::max(at_least, copies));  // the fewest such calls
    }
}

}  // namespace
}  // namespace tpdecode
