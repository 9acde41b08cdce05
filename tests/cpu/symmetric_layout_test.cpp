// The ranks compare each symmetric allocation's layout before making it
// (team/symmetric_layout.hpp): a rank that built another object is named.
#include "team/symmetric_layout.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

std::string refusal(const std::vector<SymmetricLayout>& ranks) {
  try {
    check_layouts_agree(ranks);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(SymmetricLayout, EqualLayoutsPass) {
  const SymmetricLayout a = symmetric_layout(3, 229376, 0xFFFFFFFFu, "mailbox 3x8x64x1024 B, epoch 2");
  EXPECT_EQ(refusal({a}), "");
  EXPECT_EQ(refusal({a, a, a, a}), "");
  EXPECT_EQ(refusal({}), "");
}

TEST(SymmetricLayout, EveryFieldThatDiffersIsARefusalNamingTheRanks) {
  const SymmetricLayout a = symmetric_layout(3, 229376, 0xFFFFFFFFu, "mailbox 3x8x64x1024 B, epoch 2");
  const std::vector<SymmetricLayout> others = {
      symmetric_layout(4, 229376, 0xFFFFFFFFu, "mailbox 3x8x64x1024 B, epoch 2"),
      symmetric_layout(3, 114688, 0xFFFFFFFFu, "mailbox 3x8x64x1024 B, epoch 2"),
      symmetric_layout(3, 229376, 0u, "mailbox 3x8x64x1024 B, epoch 2"),
      symmetric_layout(3, 229376, 0xFFFFFFFFu, "mailbox 3x8x128x512 B, epoch 2"),
      symmetric_layout(3, 229376, 0xFFFFFFFFu, "mailbox 3x8x64x1024 B, epoch 3"),
  };
  for (const SymmetricLayout& b : others) {
    const std::string why = refusal({a, a, b, a});
    EXPECT_NE(why.find("rank 0: allocation 3: mailbox 3x8x64x1024 B, epoch 2 (229376 B"), std::string::npos) << why;
    EXPECT_NE(why.find("; rank 2: "), std::string::npos) << why;
    EXPECT_EQ(why.find("rank 1:"), std::string::npos) << why;
    EXPECT_EQ(why.find("rank 3:"), std::string::npos) << why;
  }
  // Rank 0 the odd one: every other rank is named.
  const std::string why = refusal({others[1], a, a});
  EXPECT_NE(why.find("rank 0: allocation 3: mailbox 3x8x64x1024 B, epoch 2 (114688 B"), std::string::npos) << why;
  EXPECT_NE(why.find("; rank 1: "), std::string::npos) << why;
  EXPECT_NE(why.find("; rank 2: "), std::string::npos) << why;
}

TEST(SymmetricLayout, LongDescriptionsAreCutAndStillCompared) {
  const std::string long_what(200, 'x');
  const SymmetricLayout a = symmetric_layout(0, 16, 0, long_what);
  EXPECT_EQ(std::string(a.what), std::string(99, 'x'));
  EXPECT_EQ(refusal({a, symmetric_layout(0, 16, 0, long_what)}), "");
  EXPECT_NE(refusal({a, symmetric_layout(0, 16, 0, std::string(98, 'x'))}), "");
  // Texts that differ only beyond the cut still differ.
  EXPECT_NE(refusal({a, symmetric_layout(0, 16, 0, long_what + "y")}), "");
}

}  // namespace
}  // namespace tpdecode
