// The weight producer's cap on stages in flight (landed_wait, wgmma_plan.hpp) run
// against a model of the ring: copies that land in any order, consumers that take
// the stages in order, each stage's landed barrier counting its completed phases and
// answering a parity wait as the hardware does (passed once the barrier's current
// phase has the other parity). Every order of events is drawn at random; the
// checks: the producer never has more than the cap in flight, a wait never passes
// before its use landed, the producer is never held once that use has landed (with
// a free stage), and nothing hangs; also with a cap that changes from use to use
// (the program lowers it while its loaders poll). Planted bugs (the parity
// flipped, the wait one use late) each fail.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gemm/wgmma_plan.hpp"

namespace tpdecode::wgmma {
namespace {

using WaitRule = std::function<LandedWait(int issued, int cap, int stages)>;

// The first violated rule over `uses` uses of a ring of `stages`, or "". cap_of(use):
// the cap that use is issued under; with a constant one, never more than it in
// flight (a varying cap bounds the copies in flight only where they land in order).
std::string first_violation(const WaitRule& rule, int stages, const std::function<int(int)>& cap_of, bool constant,
                            int uses, std::mt19937& rng) {
  std::vector<int> completed(static_cast<std::size_t>(stages), 0);  // per stage: its barrier's completed phases
  std::vector<bool> landed(static_cast<std::size_t>(uses), false);
  std::vector<int> in_flight;  // uses issued, not landed
  int issued = 0, consumed = 0;
  while (consumed < uses) {
    // What may happen next.
    bool can_issue = false;
    std::string held_wrongly;
    if (issued < uses && issued - consumed < stages) {  // the stage is free
      const int cap = cap_of(issued);
      const LandedWait w = rule(issued, cap, stages);
      const bool passes =
          !w.wait || (completed[static_cast<std::size_t>(w.stage)] & 1) != static_cast<int>(w.parity);
      if (passes && issued >= cap && !landed[static_cast<std::size_t>(issued - cap)])
        return "use " + std::to_string(issued) + "'s wait passed before use " + std::to_string(issued - cap) +
               " landed";
      if (!passes && (issued < cap || landed[static_cast<std::size_t>(issued - cap)]))
        return "use " + std::to_string(issued) + " held after use " + std::to_string(issued - cap) + " landed";
      can_issue = passes;
    }
    const bool can_land = !in_flight.empty();
    const bool can_consume = consumed < issued && landed[static_cast<std::size_t>(consumed)];
    if (!can_issue && !can_land && !can_consume) return "hung at use " + std::to_string(issued);
    std::vector<int> choices;
    if (can_issue) choices.push_back(0);
    if (can_land) choices.push_back(1);
    if (can_consume) choices.push_back(2);
    switch (choices[std::uniform_int_distribution<std::size_t>(0, choices.size() - 1)(rng)]) {
      case 0:
        in_flight.push_back(issued++);
        if (constant && static_cast<int>(in_flight.size()) > cap_of(issued - 1))
          return std::to_string(in_flight.size()) + " in flight at use " + std::to_string(issued - 1);
        break;
      case 1: {
        const std::size_t i = std::uniform_int_distribution<std::size_t>(0, in_flight.size() - 1)(rng);
        const int use = in_flight[i];
        in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
        landed[static_cast<std::size_t>(use)] = true;
        ++completed[static_cast<std::size_t>(use % stages)];
        break;
      }
      default:
        ++consumed;
    }
  }
  return "";
}

std::string violation_over_shapes(const WaitRule& rule) {
  std::mt19937 rng(20261202);
  for (int stages = 1; stages <= 12; ++stages)
    for (int cap = 1; cap <= stages; ++cap)
      for (int trial = 0; trial < 20; ++trial) {
        const std::string v = first_violation(rule, stages, [=](int) { return cap; }, true, 10 * stages + 7, rng);
        if (!v.empty()) return std::to_string(stages) + " stages, cap " + std::to_string(cap) + ": " + v;
      }
  return "";
}

// Caps drawn per use from [low, high] (1 <= low <= high <= stages), runs of equal
// caps of random lengths.
std::string violation_with_varying_caps(const WaitRule& rule) {
  std::mt19937 rng(20261203);
  for (int stages = 1; stages <= 12; ++stages)
    for (int low = 1; low <= stages; ++low)
      for (int trial = 0; trial < 20; ++trial) {
        const int high = std::uniform_int_distribution<int>(low, stages)(rng);
        const int uses = 10 * stages + 7;
        std::vector<int> caps;
        while (static_cast<int>(caps.size()) < uses) {
          const int cap = std::uniform_int_distribution<int>(low, high)(rng);
          const int run = std::uniform_int_distribution<int>(1, 2 * stages)(rng);
          caps.insert(caps.end(), static_cast<std::size_t>(run), cap);
        }
        const std::string v =
            first_violation(rule, stages, [&](int use) { return caps[static_cast<std::size_t>(use)]; }, false, uses, rng);
        if (!v.empty())
          return std::to_string(stages) + " stages, caps " + std::to_string(low) + ".." + std::to_string(high) + ": " + v;
      }
  return "";
}

TEST(LandedWait, KeepsTheCapExactlyInEveryOrder) {
  EXPECT_EQ(violation_over_shapes(landed_wait), "");
}

TEST(LandedWait, WaitsForTheRightUseWhenTheCapChanges) {
  EXPECT_EQ(violation_with_varying_caps(landed_wait), "");
}

TEST(LandedWait, PlantedBugsFail) {
  const WaitRule flipped = [](int issued, int cap, int stages) {
    LandedWait w = landed_wait(issued, cap, stages);
    w.parity ^= 1u;
    return w;
  };
  const WaitRule one_late = [](int issued, int cap, int stages) { return landed_wait(issued + 1, cap, stages); };
  EXPECT_NE(violation_over_shapes(flipped), "");
  EXPECT_NE(violation_over_shapes(one_late), "");
  EXPECT_NE(violation_with_varying_caps(flipped), "");
  EXPECT_NE(violation_with_varying_caps(one_late), "");
}

TEST(LandedWait, NoWaitBeforeTheCap) {
  for (int issued = 0; issued < 4; ++issued) EXPECT_FALSE(landed_wait(issued, 4, 6).wait);
  const LandedWait w = landed_wait(13, 4, 6);  // use 9: stage 3, the barrier's phase 1
  EXPECT_TRUE(w.wait);
  EXPECT_EQ(w.stage, 3);
  EXPECT_EQ(w.parity, 1u);
}

}  // namespace
}  // namespace tpdecode::wgmma
