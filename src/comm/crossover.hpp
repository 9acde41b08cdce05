// Which path the automatic choice (CommAlgorithm::kAuto) takes where more than one
// serves a call: the one place to edit. rules.cpp reads it (crossover_choice);
// tests/cpu/comm_rules_test.cpp checks its invariants and, against every recorded
// `bench comm --json` run in tests/data/bench_comm/, that the choice is within 3 %
// of the fastest path on every measured row.
//
// An entry says: for this team size, transport and op, at `width` columns, take
// `path` from `rows` rows up to the next entry of the same (tp, transport, op,
// width), or on. Below a key's first entry, and for keys without entries, the
// choice takes the one-shot where it serves, else the stock path. A path an entry
// names that does not serve the call falls back to the same rule. For a width
// without entries the nearest width's (by ratio) are used, their rows scaled by the
// width ratio (a fixed payload rows × width), rounded up.
//
// Refit from a measured run: `tpdecode bench comm --team local --tp 2 --tp 4 --tp 8
// --hidden 2048 ... --fit` prints the entries of each measured key (the path
// within 1.5 % of the fastest, kept as long as it stays there; crossover_fit.hpp);
// replace the entries of the keys the run measured with them, say the run's date,
// machine and commit next to them, and add the run's JSON to tests/data/bench_comm/
// (`scripts/device.sh crossover` runs that sweep on the local team).
#pragma once

#include <cstdint>

#include "tpdecode/comm.hpp"

namespace tpdecode {

enum class CommTransport : uint8_t {
  kOneGpu,  // every rank on one GPU (the local team): all bytes through one memory
  kNvlink,  // one rank per GPU, peer stores over NVLink
};

struct CrossoverEntry {
  int tp;
  CommTransport transport;
  bool norm;  // ar_norm (true) or all_reduce
  int64_t width;
  int rows;       // from this many rows on
  CommPath path;  // the path to take there
};

// MEASURED on one H200 and 2 x H200 (NVLink), 2026-11-30, `bench comm` (docs/history/
// performance-2026-11.md, "The local team's two-shot, refit" and "The two-shot ArNorm:
// reducers on the rank's own columns"), H 7168:
//  - local team TP 8, all_reduce: the two-shot 8.32 µs at 8 rows (one-shot 9.71,
//    stock 9.84), 10.64 at 16 (stock 11.35), 13.42 at 32 (stock 14.92), 21.24 at 64
//    (stock 24.64); at 4 rows 7.98 against the one-shot's 8.02 (within 3 %: the
//    one-shot keeps it): from 8 rows.
//  - local team TP 8, ar_norm: the two-shot behind the one-shot at 1-4 rows
//    (11.60 vs 9.83 at 1) and behind stock from 8 (17.84 vs 16.16; 88.4 vs 43.0 at
//    64): no entry (the one-shot, then stock where it no longer serves).
//  - NCCL TP 2 (NVLink): the two-shot behind the one-shot at every row count,
//    all_reduce 3.44 vs 2.47 µs at 1 row, 6.27 vs 5.33 at 64; ar_norm 4.71 vs 3.70,
//    8.00 vs 7.73: no entry (the same bytes, one hop more).
// MEASURED on 4 x H200 (NVLink), 2026-11-30, NCCL team TP 4, H 7168 (docs/history/
// performance-2026-11.md, "The two-shot over NVLink at TP 4, measured"):
//  - all_reduce: one-shot / two-shot 4.84 / 4.81 µs at 16 rows (a tie: the one-shot
//    keeps it), 5.37 / 5.20 at 20, 5.88 / 5.61 at 24, 6.93 / 6.04 at 32, 11.17 / 7.34
//    at 64 (stock 17.23): from 20 rows.
//  - ar_norm: 6.50 / 6.85 at 16, 7.10 / 7.09 at 20 (a tie), 7.63 / 7.30 at 24, 8.76 /
//    7.90 at 32, 13.19 / 10.69 at 64: from 24 rows (measured before the two-shot
//    ArNorm's reducers got 9-17 % faster; not re-measured since).
// MODEL, NOT MEASURED (no 8-GPU machine): NVLink all_reduce, time ≈ fixed +
// hops · h + bytes / bw with h = 1.5 µs and bw = 250 GB/s (the TP 2 runs); bytes
// into each GPU per row: one-shot (TP−1)·width·2, two-shot 2·(TP−1)/TP·width·2;
// two-shot from h·bw·TP / ((TP−1)(TP−2)·width·2) rows: TP 4 from 18 (measured: 20),
// TP 8 from 5, TP 16 from 2. ArNorm at TP 8: the all_reduce's point times TP 4's
// measured ArNorm / all_reduce ratio (24 / 20): from 6.
// MEASURED on one H200, 2026-12-01, local team TP 2 / 4 / 8, widths 2048-16384, rows
// 1-64 (`bench comm --team local --tp T --op all_reduce --op ar_norm --hidden 2048
// ... --hidden 16384 --rows 1 ... --rows 64 --replays 60` on the collectives of
// 5e18808; the JSON in tests/data/bench_comm/, docs/performance.md "Collectives"):
// the entries below the NVLink ones, fitted with --fit's rule. They replace the
// local TP 8 all_reduce entry measured at H 7168 alone (the two-shot from 8 rows,
// which the sweep confirms).
inline constexpr CrossoverEntry kCrossover[] = {
    {4, CommTransport::kNvlink, false, 7168, 20, CommPath::kTwoShot},
    {4, CommTransport::kNvlink, true, 7168, 24, CommPath::kTwoShot},
    {8, CommTransport::kNvlink, false, 7168, 5, CommPath::kTwoShot},
    {8, CommTransport::kNvlink, true, 7168, 6, CommPath::kTwoShot},
    {16, CommTransport::kNvlink, false, 7168, 2, CommPath::kTwoShot},
    {2, CommTransport::kOneGpu, false, 2048, 1, CommPath::kOneShot},
    {2, CommTransport::kOneGpu, false, 4096, 1, CommPath::kOneShot},
    {2, CommTransport::kOneGpu, false, 5120, 1, CommPath::kOneShot},
    {2, CommTransport::kOneGpu, false, 7168, 1, CommPath::kOneShot},
    {2, CommTransport::kOneGpu, false, 8192, 1, CommPath::kOneShot},
    {2, CommTransport::kOneGpu, false, 12288, 1, CommPath::kOneShot},
    {2, CommTransport::kOneGpu, false, 16384, 1, CommPath::kOneShot},
    {2, CommTransport::kOneGpu, true, 2048, 1, CommPath::kOneShot},
    {2, CommTransport::kOneGpu, true, 2048, 32, CommPath::kStock},
    {2, CommTransport::kOneGpu, true, 4096, 1, CommPath::kOneShot},
    {2, CommTransport::kOneGpu, true, 4096, 32, CommPath::kStock},
    {2, CommTransport::kOneGpu, true, 5120, 1, CommPath::kOneShot},
    {2, CommTransport::kOneGpu, true, 5120, 32, CommPath::kStock},
    {2, CommTransport::kOneGpu, true, 7168, 1, CommPath::kOneShot},
    {2, CommTransport::kOneGpu, true, 7168, 32, CommPath::kStock},
    {2, CommTransport::kOneGpu, true, 8192, 1, CommPath::kOneShot},
    {2, CommTransport::kOneGpu, true, 8192, 32, CommPath::kTwoShot},
    {2, CommTransport::kOneGpu, true, 12288, 1, CommPath::kOneShot},
    {2, CommTransport::kOneGpu, true, 12288, 32, CommPath::kTwoShot},
    {2, CommTransport::kOneGpu, true, 16384, 1, CommPath::kOneShot},
    {2, CommTransport::kOneGpu, true, 16384, 23, CommPath::kTwoShot},
    {4, CommTransport::kOneGpu, false, 2048, 1, CommPath::kOneShot},
    {4, CommTransport::kOneGpu, false, 4096, 1, CommPath::kOneShot},
    {4, CommTransport::kOneGpu, false, 4096, 47, CommPath::kStock},
    {4, CommTransport::kOneGpu, false, 5120, 1, CommPath::kOneShot},
    {4, CommTransport::kOneGpu, false, 5120, 32, CommPath::kStock},
    {4, CommTransport::kOneGpu, false, 5120, 64, CommPath::kTwoShot},
    {4, CommTransport::kOneGpu, false, 7168, 1, CommPath::kOneShot},
    {4, CommTransport::kOneGpu, false, 7168, 23, CommPath::kTwoShot},
    {4, CommTransport::kOneGpu, false, 8192, 1, CommPath::kOneShot},
    {4, CommTransport::kOneGpu, false, 8192, 23, CommPath::kStock},
    {4, CommTransport::kOneGpu, false, 8192, 47, CommPath::kTwoShot},
    {4, CommTransport::kOneGpu, false, 12288, 1, CommPath::kOneShot},
    {4, CommTransport::kOneGpu, false, 12288, 16, CommPath::kStock},
    {4, CommTransport::kOneGpu, false, 12288, 32, CommPath::kTwoShot},
    {4, CommTransport::kOneGpu, false, 16384, 1, CommPath::kOneShot},
    {4, CommTransport::kOneGpu, false, 16384, 12, CommPath::kStock},
    {4, CommTransport::kOneGpu, false, 16384, 32, CommPath::kTwoShot},
    {4, CommTransport::kOneGpu, false, 16384, 64, CommPath::kStock},
    {4, CommTransport::kOneGpu, true, 2048, 1, CommPath::kOneShot},
    {4, CommTransport::kOneGpu, true, 2048, 16, CommPath::kTwoShot},
    {4, CommTransport::kOneGpu, true, 2048, 47, CommPath::kStock},
    {4, CommTransport::kOneGpu, true, 4096, 1, CommPath::kOneShot},
    {4, CommTransport::kOneGpu, true, 4096, 16, CommPath::kTwoShot},
    {4, CommTransport::kOneGpu, true, 4096, 47, CommPath::kStock},
    {4, CommTransport::kOneGpu, true, 5120, 1, CommPath::kOneShot},
    {4, CommTransport::kOneGpu, true, 5120, 16, CommPath::kStock},
    {4, CommTransport::kOneGpu, true, 7168, 1, CommPath::kOneShot},
    {4, CommTransport::kOneGpu, true, 7168, 12, CommPath::kTwoShot},
    {4, CommTransport::kOneGpu, true, 7168, 16, CommPath::kStock},
    {4, CommTransport::kOneGpu, true, 8192, 1, CommPath::kOneShot},
    {4, CommTransport::kOneGpu, true, 8192, 12, CommPath::kTwoShot},
    {4, CommTransport::kOneGpu, true, 12288, 1, CommPath::kOneShot},
    {4, CommTransport::kOneGpu, true, 12288, 12, CommPath::kTwoShot},
    {4, CommTransport::kOneGpu, true, 12288, 23, CommPath::kStock},
    {4, CommTransport::kOneGpu, true, 16384, 1, CommPath::kOneShot},
    {4, CommTransport::kOneGpu, true, 16384, 8, CommPath::kTwoShot},
    {4, CommTransport::kOneGpu, true, 16384, 16, CommPath::kStock},
    {8, CommTransport::kOneGpu, false, 2048, 1, CommPath::kOneShot},
    {8, CommTransport::kOneGpu, false, 2048, 16, CommPath::kTwoShot},
    {8, CommTransport::kOneGpu, false, 4096, 1, CommPath::kOneShot},
    {8, CommTransport::kOneGpu, false, 4096, 8, CommPath::kTwoShot},
    {8, CommTransport::kOneGpu, false, 5120, 1, CommPath::kOneShot},
    {8, CommTransport::kOneGpu, false, 5120, 8, CommPath::kTwoShot},
    {8, CommTransport::kOneGpu, false, 7168, 1, CommPath::kOneShot},
    {8, CommTransport::kOneGpu, false, 7168, 8, CommPath::kTwoShot},
    {8, CommTransport::kOneGpu, false, 8192, 1, CommPath::kOneShot},
    {8, CommTransport::kOneGpu, false, 8192, 4, CommPath::kTwoShot},
    {8, CommTransport::kOneGpu, false, 12288, 1, CommPath::kOneShot},
    {8, CommTransport::kOneGpu, false, 12288, 4, CommPath::kTwoShot},
    {8, CommTransport::kOneGpu, false, 16384, 1, CommPath::kOneShot},
    {8, CommTransport::kOneGpu, false, 16384, 2, CommPath::kTwoShot},
    {8, CommTransport::kOneGpu, true, 2048, 1, CommPath::kOneShot},
    {8, CommTransport::kOneGpu, true, 2048, 8, CommPath::kTwoShot},
    {8, CommTransport::kOneGpu, true, 2048, 32, CommPath::kStock},
    {8, CommTransport::kOneGpu, true, 4096, 1, CommPath::kOneShot},
    {8, CommTransport::kOneGpu, true, 4096, 8, CommPath::kTwoShot},
    {8, CommTransport::kOneGpu, true, 4096, 47, CommPath::kStock},
    {8, CommTransport::kOneGpu, true, 5120, 1, CommPath::kOneShot},
    {8, CommTransport::kOneGpu, true, 5120, 4, CommPath::kTwoShot},
    {8, CommTransport::kOneGpu, true, 5120, 16, CommPath::kStock},
    {8, CommTransport::kOneGpu, true, 7168, 1, CommPath::kOneShot},
    {8, CommTransport::kOneGpu, true, 7168, 8, CommPath::kStock},
    {8, CommTransport::kOneGpu, true, 8192, 1, CommPath::kOneShot},
    {8, CommTransport::kOneGpu, true, 8192, 8, CommPath::kTwoShot},
    {8, CommTransport::kOneGpu, true, 8192, 16, CommPath::kStock},
    {8, CommTransport::kOneGpu, true, 12288, 1, CommPath::kOneShot},
    {8, CommTransport::kOneGpu, true, 12288, 4, CommPath::kStock},
    {8, CommTransport::kOneGpu, true, 16384, 1, CommPath::kOneShot},
    {8, CommTransport::kOneGpu, true, 16384, 4, CommPath::kStock},
};

}  // namespace tpdecode
