// Each driven rank of a call needs a stream of its own (team/rank_streams.hpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "team/rank_streams.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

cudaStream_t fake(std::uintptr_t v) { return reinterpret_cast<cudaStream_t>(v); }

TEST(RankStreams, EachRankItsOwn) {
  EXPECT_NO_THROW(check_distinct_streams({}, "op"));
  const std::vector<cudaStream_t> one = {nullptr};  // one driven rank: the legacy stream will do
  EXPECT_NO_THROW(check_distinct_streams(one, "op"));
  const std::vector<cudaStream_t> apart = {fake(0x10), fake(0x20), nullptr, fake(0x30)};
  EXPECT_NO_THROW(check_distinct_streams(apart, "op"));
  for (const std::vector<cudaStream_t>& shared :
       {std::vector<cudaStream_t>{nullptr, nullptr}, std::vector<cudaStream_t>{fake(0x10), fake(0x20), fake(0x10)}}) {
    try {
      check_distinct_streams(shared, "all_reduce");
      ADD_FAILURE() << "a shared stream passed";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("all_reduce: driven ranks 0 and"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tpdecode
