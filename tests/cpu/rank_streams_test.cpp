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
  const std::vector<cudaStream_t> apart = {fake(0x10), fake(0x20), cudaStreamPerThread, fake(0x30)};
  EXPECT_NO_THROW(check_distinct_streams(apart, "op"));
  for (const std::vector<cudaStream_t>& shared :
       {std::vector<cudaStream_t>{fake(0x40), fake(0x40)},
        std::vector<cudaStream_t>{fake(0x10), fake(0x20), fake(0x10)}}) {
    try {
      check_distinct_streams(shared, "all_reduce");
      ADD_FAILURE() << "a shared stream passed";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("all_reduce: driven ranks 0 and"), std::string::npos) << e.what();
    }
  }
}

// The legacy default stream (0 or cudaStreamLegacy) serialises with every blocking
// stream: no driven rank of two or more may run there.
TEST(RankStreams, NoRankOnTheLegacyStream) {
  for (cudaStream_t legacy : {static_cast<cudaStream_t>(nullptr), cudaStreamLegacy}) {
    const std::vector<cudaStream_t> mixed = {fake(0x10), legacy};
    try {
      check_distinct_streams(mixed, "gather");
      ADD_FAILURE() << "the legacy stream passed";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("gather: driven rank 1 was given the legacy default stream"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace tpdecode
