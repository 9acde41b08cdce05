#include "gemm/adjacent_links.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/check.hpp"

namespace tpdecode {

std::vector<bool> choose_adjacent_links(const std::vector<LinkOptions>& links, double boundary_us) {
  check(boundary_us >= 0, "adjacent links: a boundary of {} us", boundary_us);
  const std::size_t n = links.size();
  if (n == 0) return {};
  // best[i][s]: the least cost of links i .. n-1 and of the boundaries after link i,
  // given link i takes option s (0: PDL, 1: stock; infinite where it has none); the
  // right end is a PDL neighbour.
  std::vector<std::array<double, 2>> best(n);
  const auto lost = [&](bool pdl_a, bool pdl_b) { return pdl_a && pdl_b ? 0.0 : boundary_us; };
  for (std::size_t i = n; i-- > 0;) {
    const LinkOptions& l = links[i];
    check(std::isfinite(l.pdl_us) || std::isfinite(l.stock_us), "adjacent links: link {} has no option", i);
    for (const bool pdl : {true, false}) {
      const double rest = i + 1 == n ? lost(pdl, true)
                                     : std::min(lost(pdl, true) + best[i + 1][0], lost(pdl, false) + best[i + 1][1]);
      best[i][pdl ? 0 : 1] = (pdl ? l.pdl_us : l.stock_us) + rest;
    }
  }
  // Forwards: each link's option given the one before it (the left end a PDL neighbour).
  std::vector<bool> pdl(n);
  bool before = true;
  for (std::size_t i = 0; i < n; ++i) {
    const double take_pdl = lost(before, true) + best[i][0];
    const double take_stock = lost(before, false) + best[i][1];
    pdl[i] = take_pdl <= take_stock;
    before = pdl[i];
  }
  return pdl;
}

std::vector<std::vector<bool>> adjacent_assignments(const std::vector<LinkOptions>& links, double boundary_us) {
  std::vector<std::vector<bool>> assignments = {choose_adjacent_links(links, boundary_us)};
  for (const bool side : {true, false}) {
    std::vector<bool> a = assignments[0];
    for (std::size_t i = 0; i < links.size(); ++i)
      if (std::isfinite(links[i].pdl_us) && std::isfinite(links[i].stock_us)) a[i] = side;
    if (std::find(assignments.begin(), assignments.end(), a) == assignments.end()) assignments.push_back(a);
  }
  return assignments;
}

}  // namespace tpdecode
