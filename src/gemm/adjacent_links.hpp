// Which path each link of a chain of GEMMs launched back to back takes, decided for
// the chain as a whole (DecodeGemm::decide_adjacent). A boundary between two PDL
// kernels overlaps the next kernel's start with the previous one's tail; one with a
// kernel that leaves no overlap (what charged_in_chains names: cuBLAS, cuBLASLt, the
// wgmma engine's wide form or a ring beyond half an SM) on either side does not. A
// link decided alone as a chain link is charged kChainBoundaryUs for such a path
// (both its boundaries); between two such links that charge buys nothing.
#pragma once

#include <limits>
#include <vector>

namespace tpdecode {

// A link's measured options, microseconds; infinite where the link has no such option.
struct LinkOptions {
  double pdl_us = std::numeric_limits<double>::infinity();    // its fastest PDL path
  double stock_us = std::numeric_limits<double>::infinity();  // its fastest non-PDL path
};

// Per link, true where it takes its PDL option: the assignment with the least
// Σ time + boundary_us × (boundaries with a non-PDL kernel on either side), the
// chain's two ends counting as boundaries with PDL kernels outside. Ties go to the
// PDL option, link by link from the first. InvalidArgument where a link has neither
// option or boundary_us is negative.
std::vector<bool> choose_adjacent_links(const std::vector<LinkOptions>& links, double boundary_us);

// The assignments DecodeGemm::decide_adjacent times as the chain itself, in order:
// the model's (choose_adjacent_links), then every link with both options on its PDL
// side, then every such link on its stock side (links with one option as in the
// model's), each only where it differs from those before. One: nothing to time.
std::vector<std::vector<bool>> adjacent_assignments(const std::vector<LinkOptions>& links, double boundary_us);

}  // namespace tpdecode
