// How many copies of a weight a timed graph rotates over, so that every call reads
// its weight from HBM and not from L2: the one rule of the tuner and every benchmark.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace tpdecode {

// Why 5 x L2: a copy is read again only after at least 4 x L2 of other copies have
// streamed past it, so no call finds its weight in L2 (DESIGN.md's rule for
// benchmarks). The tuner pays little for it: for any weight above 6 MB its graphs
// already stream 384 MB or more per replay (gemm_measure.cpp), over 5 x the 50-60 MB
// L2 of an H100 or H200, so the factor adds only the copies' memory and one copy.
inline constexpr double kRotationL2s = 5.0;
// Why at most 64: below 5 x L2 / 64 (about 5 MB on an H200) the copies total less
// than 5 x L2, but such calls are bound by launch and latency, not by the read (a
// 3.5 MB weight takes 3-8 us, its read at 4.5 TB/s under 1 us), and a tuning graph
// of more calls would cost more than the decision is worth.
inline constexpr int kMaxWeightCopies = 64;

// Copies (1 .. kMaxWeightCopies) of a `weight_bytes` weight that total at least
// kRotationL2s x `l2_bytes` where the cap allows.
inline int weight_copies(std::size_t weight_bytes, std::size_t l2_bytes) {
  const double bytes = static_cast<double>(std::max<std::size_t>(weight_bytes, 1));
  const double want = std::ceil(kRotationL2s * static_cast<double>(l2_bytes) / bytes);
  return static_cast<int>(std::clamp(want, 1.0, static_cast<double>(kMaxWeightCopies)));
}

// Calls of a graph whose call c reads copy c % copies: at least `at_least`, in whole
// rotations. Why whole: graphs are replayed back to back (the tuner's candidates
// share the copies), so a graph that ends on copy 0 is followed by one that begins
// with it, and that call finds its weight partly in L2. With 3 copies of a 132 MB
// weight in graphs of 4 calls, the tuner timed a tactic at 38.3 us that ran at 41.8
// in the benchmark's graphs, and chose it over one that ran at 37.6 (2026-12-01).
inline int rotation_calls(int copies, int at_least) {
  const int c = std::max(copies, 1);
  return (std::max(at_least, c) + c - 1) / c * c;
}

}  // namespace tpdecode
