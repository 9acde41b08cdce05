// The team's deadlines are bounded (a value meant as "never" would wrap the
// kernels' and the host's deadline arithmetic): a Team with no GPU behind it.
#include <gtest/gtest.h>

#include <cstdlib>

#include "tpdecode/error.hpp"
#include "tpdecode/nccl_team.hpp"
#include "tpdecode/team.hpp"

namespace tpdecode {
namespace {

class NoGpuTeam final : public Team {
 public:
  explicit NoGpuTeam(const TeamOptions& options) : Team(2, options) {}
  TeamKind kind() const override { return TeamKind::kLocal; }
  std::string describe() const override { return "no GPU"; }

 protected:
  void allocate_symmetric(std::size_t, std::vector<void*>&, std::vector<PeerPointers>&) override {}
  void free_symmetric(const std::vector<void*>&) override {}
  void barrier(std::chrono::milliseconds) override {}
  void gather_host(const void*, std::size_t, void*, std::chrono::milliseconds) override {}
  void on_stuck(int, const std::string&) override {}
};

TeamOptions with(uint64_t timeout_ms, uint64_t barrier_ms) {
  TeamOptions o;
  o.timeout_ms = timeout_ms;
  o.barrier_timeout_ms = barrier_ms;
  return o;
}

TEST(TeamOptions, DeadlinesUpToADay) {
  EXPECT_NO_THROW(NoGpuTeam(with(kMaxDeadlineMs, kMaxDeadlineMs)));
  EXPECT_NO_THROW(NoGpuTeam(with(1, 1)));
  EXPECT_THROW(NoGpuTeam(with(kMaxDeadlineMs + 1, 0)), InvalidArgument);
  EXPECT_THROW(NoGpuTeam(with(0, kMaxDeadlineMs + 1)), InvalidArgument);
  EXPECT_THROW(NoGpuTeam(with(~uint64_t{0}, 0)), InvalidArgument);
}

TEST(TeamOptions, EnvironmentDeadlinesAreBoundedToo) {
  ASSERT_EQ(setenv("TPDECODE_TIMEOUT_MS", "18446744073709551615", 1), 0);
  EXPECT_THROW(NoGpuTeam(with(0, 0)), InvalidArgument);
  EXPECT_NO_THROW(NoGpuTeam(with(5000, 0)));  // the option wins over the variable
  unsetenv("TPDECODE_TIMEOUT_MS");
  ASSERT_EQ(setenv("TPDECODE_BARRIER_TIMEOUT_MS", "86400001", 1), 0);
  EXPECT_THROW(NoGpuTeam(with(0, 0)), InvalidArgument);
  unsetenv("TPDECODE_BARRIER_TIMEOUT_MS");
  EXPECT_NO_THROW(NoGpuTeam(with(0, 0)));
}

// The NCCL team needs the runtime of the release its device API was compiled against.
TEST(NcclVersions, OneReleaseMatchesAnotherDoesNot) {
  EXPECT_TRUE(nccl_versions_match(22809, 22809));
  EXPECT_TRUE(nccl_versions_match(22812, 22809));  // a patch release
  EXPECT_FALSE(nccl_versions_match(23007, 22809));  // 2.30.7 against 2.28.9's headers
  EXPECT_FALSE(nccl_versions_match(22809, 23007));
  EXPECT_FALSE(nccl_versions_match(32809, 22809));
}

}  // namespace
}  // namespace tpdecode
