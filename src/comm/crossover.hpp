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

// MODEL VALUES, NOT MEASURED (the two-shot had not run on a GPU when they were
// set). Time per call ≈ fixed + hops · h + bytes / bw, the fixed cost the same for
// both paths; the one-shot makes one hop, the two-shot two.
//  - NVLink, bytes into each GPU per row: one-shot (TP−1)·width·2, two-shot
//    2·(TP−1)/TP·width·2. Two-shot from rows = h·bw·TP / ((TP−1)(TP−2)·width·2).
//    h = 1.5 µs and bw = 250 GB/s, from the TP 2 runs in docs/performance.md
//    (gather_context 2.08 µs at 1 row, less ~0.5 µs of launch, is one hop; the
//    gather and ArNorm grow 1.7 µs per 0.46 MB and 4.1 µs per 0.92 MB from 1 to
//    64 rows). Width 7168: TP 4 from 18 rows, TP 8 from 5, TP 16 from 2; TP 2
//    never (the same bytes, one more hop).
//  - One GPU (the local team), stores per row through the one memory: one-shot
//    TP²·width·2, two-shot 2·TP·width·2. Two-shot from rows = h·bw / ((TP² −
//    2·TP)·width·2). h = 1 µs (a poll round trip through L2) and bw = 1.4 TB/s
//    (the local TP 8 gather_context grows 5.2 µs for 7.3 MB of stores from 1 to 64
//    rows). Width 7168: TP 4 from 13 rows, TP 8 from 3, TP 16 from 1; TP 2 never.
// The ArNorm entries repeat the all-reduce's until measured.
inline constexpr CrossoverPoint kCrossover[] = {
    {2, CommTransport::kNvlink, false, 7168, kNever}, {2, CommTransport::kNvlink, true, 7168, kNever},
    {4, CommTransport::kNvlink, false, 7168, 18},     {4, CommTransport::kNvlink, true, 7168, 18},
    {8, CommTransport::kNvlink, false, 7168, 5},      {8, CommTransport::kNvlink, true, 7168, 5},
    {16, CommTransport::kNvlink, false, 7168, 2},     {16, CommTransport::kNvlink, true, 7168, 2},
    {2, CommTransport::kOneGpu, false, 7168, kNever}, {2, CommTransport::kOneGpu, true, 7168, kNever},
    {4, CommTransport::kOneGpu, false, 7168, 13},     {4, CommTransport::kOneGpu, true, 7168, 13},
    {8, CommTransport::kOneGpu, false, 7168, 3},      {8, CommTransport::kOneGpu, true, 7168, 3},
    {16, CommTransport::kOneGpu, false, 7168, 1},     {16, CommTransport::kOneGpu, true, 7168, 1},
};

}  // namespace tpdecode
