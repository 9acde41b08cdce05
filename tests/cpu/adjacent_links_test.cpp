// The joint decision of a chain of adjacent GEMM links (gemm/adjacent_links.hpp):
// against every assignment enumerated, and the cases the chain benchmark meets.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "gemm/adjacent_links.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The cost of one assignment, written from the definition.
double cost_of(const std::vector<LinkOptions>& links, const std::vector<bool>& pdl, double g) {
  double total = 0;
  for (std::size_t i = 0; i < links.size(); ++i) total += pdl[i] ? links[i].pdl_us : links[i].stock_us;
  for (std::size_t b = 0; b <= links.size(); ++b) {  // boundary b sits before link b
    const bool left = b == 0 || pdl[b - 1];
    const bool right = b == links.size() || pdl[b];
    if (!(left && right)) total += g;
  }
  return total;
}

TEST(AdjacentLinks, MatchesTheBestOfEveryAssignment) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> us(5.0, 15.0);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::size_t n = 1 + rng() % 10;
    const double g = (rng() % 4) * 0.75;
    std::vector<LinkOptions> links(n);
    for (LinkOptions& l : links) {
      l.pdl_us = us(rng);
      l.stock_us = us(rng);
      if (rng() % 4 == 0) (rng() % 2 ? l.pdl_us : l.stock_us) = kInf;  // one kind only
    }
    double least = kInf;
    for (uint32_t mask = 0; mask < (1u << n); ++mask) {
      std::vector<bool> pdl(n);
      for (std::size_t i = 0; i < n; ++i) pdl[i] = (mask >> i) & 1u;
      least = std::min(least, cost_of(links, pdl, g));
    }
    const std::vector<bool> got = choose_adjacent_links(links, g);
    ASSERT_EQ(got.size(), n);
    for (std::size_t i = 0; i < n; ++i) EXPECT_TRUE(std::isfinite(got[i] ? links[i].pdl_us : links[i].stock_us));
    EXPECT_NEAR(cost_of(links, got, g), least, 1e-9) << "trial " << trial;
  }
}

TEST(AdjacentLinks, AnEngineLinkBetweenStockLinksGainsNoOverlap) {
  // TP 8 at 64 rows: o_proj's engine path 9.4 us against cuBLASLt's 8.5, between
  // links that only cuBLAS runs fast: the engine path buys no boundary.
  const std::vector<LinkOptions> between = {{kInf, 13.2}, {9.4, 8.5}, {kInf, 23.9}};
  EXPECT_EQ(choose_adjacent_links(between, 1.0), (std::vector<bool>{false, false, false}));
  // The same link between PDL links: the stock path would lose both boundaries.
  const std::vector<LinkOptions> among = {{7.0, kInf}, {9.4, 8.5}, {7.0, kInf}};
  EXPECT_EQ(choose_adjacent_links(among, 1.0), (std::vector<bool>{true, true, true}));
  // Two engine links side by side between stock links: the boundary between them
  // is worth 1 us; 0.9 + 0.9 us more alone is not.
  const std::vector<LinkOptions> pair = {{kInf, 10}, {9.4, 8.5}, {9.4, 8.5}, {kInf, 10}};
  EXPECT_EQ(choose_adjacent_links(pair, 1.0), (std::vector<bool>{false, false, false, false}));
  const std::vector<LinkOptions> close = {{kInf, 10}, {8.8, 8.5}, {8.8, 8.5}, {kInf, 10}};
  EXPECT_EQ(choose_adjacent_links(close, 1.0), (std::vector<bool>{false, true, true, false}));
  // No boundary cost: each link its faster option; ties to PDL.
  EXPECT_EQ(choose_adjacent_links({{9.4, 8.5}, {8.0, 8.0}, {7.0, 7.5}}, 0.0), (std::vector<bool>{false, true, true}));
}

// What decide_adjacent times: the model's assignment, then the links with both
// options all on one side, then all on the other, without repeats; links with one
// option keep the model's choice in every assignment.
TEST(AdjacentLinks, TheTimedAssignmentsStartWithTheModelsAndDoNotRepeat) {
  // TP 4 at one row: gate_up's chain decision 36.56 us, alone (a full-SM ring) 34.94
  // with two charged boundaries: the model keeps the chain decision.
  const std::vector<LinkOptions> layer = {{8.98, kInf}, {5.73, kInf}, {12.10, kInf}, {36.56, 34.94}, {17.39, kInf}};
  using A = std::vector<bool>;
  EXPECT_EQ(adjacent_assignments(layer, 1.0), (std::vector<A>{A(5, true), {true, true, true, false, true}}));
  // One option everywhere: the model's alone.
  EXPECT_EQ(adjacent_assignments({{7.0, kInf}, {kInf, 9.0}}, 1.0), (std::vector<A>{{true, false}}));
  // The model mixes sides (links 1-2 stock beside the stock link 0, link 4 PDL between
  // PDL links): all three differ; the stock-only link stays stock.
  const std::vector<LinkOptions> mixed = {{kInf, 10}, {9.4, 7.0}, {9.4, 7.0}, {7.0, kInf}, {9.4, 8.5}, {7.0, kInf}};
  const std::vector<A> got = adjacent_assignments(mixed, 1.0);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], choose_adjacent_links(mixed, 1.0));
  EXPECT_EQ(got[0], (A{false, false, false, true, true, true}));
  EXPECT_EQ(got[1], (A{false, true, true, true, true, true}));
  EXPECT_EQ(got[2], (A{false, false, false, true, false, true}));
  EXPECT_TRUE(adjacent_assignments({}, 1.0).front().empty());
}

TEST(AdjacentLinks, RefusesWhatHasNoAnswer) {
  EXPECT_TRUE(choose_adjacent_links({}, 1.0).empty());
  EXPECT_THROW(choose_adjacent_links({{1.0, 1.0}, {kInf, kInf}}, 1.0), InvalidArgument);
  EXPECT_THROW(choose_adjacent_links({{1.0, 1.0}}, -1.0), InvalidArgument);
}

}  // namespace
}  // namespace tpdecode
