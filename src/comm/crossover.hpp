// When the automatic choice (CommAlgorithm::kAuto) takes the two-shot all-reduce
// rather than the one-shot, where both serve a call: the crossover table, the one
// place to edit. rules.cpp reads it (two_shot_from_rows); tests/cpu/
// comm_rules_test.cpp checks its invariants.
//
// An entry says: for this team size, transport and op, measured at `width`
// columns, the two-shot is the faster path from `two_shot_from` rows on (kNever:
// at no row count). For another width the nearest entry's row count is scaled by
// width ratio (the crossover is at a fixed payload rows × width in the model).
//
// Refit from `tpdecode bench comm` (its JSON holds one-shot and two-shot µs per
// row): two_shot_from = the smallest measured row count from which the two-shot is
// faster at every measured row; keep the comment below saying which run it is.
#pragma once

#include <cstdint>

namespace tpdecode {

enum class CommTransport : uint8_t {
  kOneGpu,  // every rank on one GPU (the local team): all bytes through one memory
  kNvlink,  // one rank per GPU, peer stores over NVLink
};

struct CrossoverPoint {
  int tp;
  CommTransport transport;
  bool norm;  // ar_norm (true) or all_reduce
  int64_t width;
  int two_shot_from;  // rows
};

inline constexpr int kNever = 1 << 30;

// MODEL VALUES, NOT MEASURED (2026-12, before the two-shot first ran on a GPU).
// Time per call ≈ hops · h + bytes / bw, the same fixed cost for both paths:
//  - NVLink: bytes into each GPU per row: one-shot (TP−1)·width·2, two-shot
//    2·(TP−1)/TP·width·2; one hop vs two. Crossover rows = h·bw·TP /
//    ((TP−1)(TP−2)·width·2) with h = 1.5 µs (the order of the TP 2 ArNorm's
//    3.25 µs, kernel included) and bw = 350 GB/s: TP 4: 25, TP 8: 7, TP 16: 3 at
//    width 7168; TP 2 never (same bytes, one more hop).
//  - One GPU: stores per row through the one memory: one-shot TP²·width·2,
//    two-shot 2·TP·width·2. Crossover rows = h·bw / ((TP² − 2·TP)·width·2) with
//    h = 1 µs (a poll round trip through L2) and bw = 3 TB/s: TP 4: 27, TP 8: 5,
//    TP 16: 1; TP 2 never.
// The norm entries repeat the all-reduce's until measured.
inline constexpr CrossoverPoint kCrossover[] = {
    {2, CommTransport::kNvlink, false, 7168, kNever}, {2, CommTransport::kNvlink, true, 7168, kNever},
    {4, CommTransport::kNvlink, false, 7168, 25},     {4, CommTransport::kNvlink, true, 7168, 25},
    {8, CommTransport::kNvlink, false, 7168, 7},      {8, CommTransport::kNvlink, true, 7168, 7},
    {16, CommTransport::kNvlink, false, 7168, 3},     {16, CommTransport::kNvlink, true, 7168, 3},
    {2, CommTransport::kOneGpu, false, 7168, kNever}, {2, CommTransport::kOneGpu, true, 7168, kNever},
    {4, CommTransport::kOneGpu, false, 7168, 27},     {4, CommTransport::kOneGpu, true, 7168, 27},
    {8, CommTransport::kOneGpu, false, 7168, 5},      {8, CommTransport::kOneGpu, true, 7168, 5},
    {16, CommTransport::kOneGpu, false, 7168, 1},     {16, CommTransport::kOneGpu, true, 7168, 1},
};

}  // namespace tpdecode
