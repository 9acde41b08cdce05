// The automatic choice's table (crossover.hpp): its invariants, how a call finds
// its entry (nearest width, rows scaled by the width ratio), the choice it makes,
// the fit that writes the table from a measured run, and the recorded runs in
// tests/data/bench_comm/ against the compiled table (within 3 % on every row).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "comm/crossover_fit.hpp"
#include "comm/rules.hpp"
#include "core/rank_switch.hpp"
#include "cpu/comm_limits.hpp"

namespace tpdecode {
namespace {

using test::tp8_limits;
using test::with_two_shot;

TEST(Crossover, CompiledTableIsServableAndSortedPerKey) {
  for (std::size_t i = 0; i < std::size(kCrossover); ++i) {
    const CrossoverEntry& c = kCrossover[i];
    EXPECT_TRUE(supported_team_size(c.tp) && c.tp > 1) << c.tp;
    EXPECT_GE(c.rows, 1);
    if (c.path == CommPath::kTwoShot) EXPECT_EQ(c.width % (8 * c.tp), 0) << "TP " << c.tp << " width " << c.width;
    if (c.norm) EXPECT_TRUE(ar_norm_hidden_served(c.width)) << c.width;
    const CrossoverEntry* previous = nullptr;  // the key's entry before this one
    for (std::size_t k = 0; k < i; ++k) {
      const CrossoverEntry& e = kCrossover[k];
      if (e.tp == c.tp && e.transport == c.transport && e.norm == c.norm && e.width == c.width) {
        EXPECT_LT(e.rows, c.rows) << "entries of a key in row order, one per row count";
        previous = &e;
      }
    }
    if (previous) EXPECT_NE(previous->path, c.path) << "an entry that changes nothing";
  }
}

constexpr CrossoverEntry kTable[] = {
    {4, CommTransport::kOneGpu, false, 4096, 1, CommPath::kOneShot},
    {4, CommTransport::kOneGpu, false, 4096, 10, CommPath::kTwoShot},
    {4, CommTransport::kOneGpu, false, 4096, 40, CommPath::kStock},
    {4, CommTransport::kOneGpu, false, 16384, 4, CommPath::kTwoShot},
    {4, CommTransport::kOneGpu, true, 4096, 3, CommPath::kStock},
};

TEST(Crossover, ACallFindsTheNearestWidthsEntryWithItsRowsScaled) {
  const auto at = [](bool norm, int64_t width, int64_t rows) {
    return crossover_choice(kTable, 4, CommTransport::kOneGpu, norm, width, rows);
  };
  EXPECT_EQ(at(false, 4096, 1), CommPath::kOneShot);
  EXPECT_EQ(at(false, 4096, 9), CommPath::kOneShot);
  EXPECT_EQ(at(false, 4096, 10), CommPath::kTwoShot);
  EXPECT_EQ(at(false, 4096, 39), CommPath::kTwoShot);
  EXPECT_EQ(at(false, 4096, 64), CommPath::kStock);
  EXPECT_EQ(at(false, 16384, 3), std::nullopt) << "below a width's first entry: no choice";
  EXPECT_EQ(at(false, 16384, 4), CommPath::kTwoShot);
  // 2048 is nearest 4096 (ratio 2, against 8): 4096's rows doubled.
  EXPECT_EQ(at(false, 2048, 19), CommPath::kOneShot);
  EXPECT_EQ(at(false, 2048, 20), CommPath::kTwoShot);
  EXPECT_EQ(at(false, 2048, 80), CommPath::kStock);
  // 12288 is nearest 16384 (ratio 1.33, against 3): 4 rows scaled up to 6.
  EXPECT_EQ(at(false, 12288, 5), std::nullopt);
  EXPECT_EQ(at(false, 12288, 6), CommPath::kTwoShot);
  // 8192: ratio 2 either way; the first listed (4096) keeps it, its rows halved.
  EXPECT_EQ(at(false, 8192, 4), CommPath::kOneShot);
  EXPECT_EQ(at(false, 8192, 5), CommPath::kTwoShot);
  EXPECT_EQ(at(true, 4096, 2), std::nullopt);
  EXPECT_EQ(at(true, 4096, 3), CommPath::kStock);
  EXPECT_EQ(crossover_choice(kTable, 8, CommTransport::kOneGpu, false, 4096, 20), std::nullopt) << "another TP";
  EXPECT_EQ(crossover_choice(kTable, 4, CommTransport::kNvlink, false, 4096, 20), std::nullopt) << "another transport";
}

TEST(Crossover, TheChoiceTakesTheNamedPathWhereItServesElseOneShotElseStock) {
  CommLimits l = with_two_shot(tp8_limits(), true);
  l.team_size = 4;
  l.hidden = 16384;
  l.one_shot_rows = 12;
  l.ar_norm_rows = 5;
  const auto path = [&](int64_t rows, int64_t width, bool norm) {
    return choose_all_reduce(l, CommAlgorithm::kAuto, rows, width, norm, kTable).path;
  };
  EXPECT_EQ(path(5, 4096, false), CommPath::kOneShot);
  EXPECT_EQ(path(20, 4096, false), CommPath::kTwoShot);
  const CommResult stock = choose_all_reduce(l, CommAlgorithm::kAuto, 50, 4096, false, kTable);
  EXPECT_EQ(stock.path, CommPath::kStock);
  EXPECT_NE(stock.why.find("measured fastest"), std::string::npos) << stock.why;
  EXPECT_EQ(path(3, 4096, true), CommPath::kStock);
  // The named two-shot does not serve a width that is not 8 · TP columns: the one-shot.
  EXPECT_EQ(path(11, 4096 + 8, false), CommPath::kOneShot);
  // Neither named nor served by the one-shot: stock, with both reasons.
  const CommResult none = choose_all_reduce(l, CommAlgorithm::kAuto, 13, 4096 + 8, false, kTable);
  EXPECT_EQ(none.path, CommPath::kStock);
  EXPECT_NE(none.why.find("8 · TP"), std::string::npos) << none.why;
  // No entry for the key (the ArNorm below its first entry): the one-shot where it serves, else stock.
  EXPECT_EQ(path(2, 4096, true), CommPath::kOneShot);
  // Batch-invariant: never stock where a mailbox path serves, the measured stock included.
  l.batch_invariant = true;
  EXPECT_EQ(path(50, 4096, false), CommPath::kTwoShot);
  EXPECT_EQ(path(3, 4096, true), CommPath::kOneShot);
  EXPECT_EQ(path(40, 4096, true), CommPath::kTwoShot);
}

TEST(Crossover, CompiledTableAtTheMeasuredPoints) {
  CommLimits l = with_two_shot(tp8_limits(), true);  // local TP 8: one-shot 21 rows, ArNorm 7
  l.hidden = 8192;
  for (int rows = 1; rows <= 64; ++rows) {
    const CommPath all_reduce = choose_all_reduce(l, CommAlgorithm::kAuto, rows, 7168, false).path;
    EXPECT_EQ(all_reduce, rows >= 8 ? CommPath::kTwoShot : CommPath::kOneShot) << rows;
    const CommPath norm = choose_all_reduce(l, CommAlgorithm::kAuto, rows, 7168, true).path;
    EXPECT_EQ(norm, rows <= 7 ? CommPath::kOneShot : CommPath::kStock) << rows;
  }
  l.one_gpu = false;
  l.team_size = 4;
  EXPECT_EQ(choose_all_reduce(l, CommAlgorithm::kAuto, 19, 7168, false).path, CommPath::kOneShot);
  EXPECT_EQ(choose_all_reduce(l, CommAlgorithm::kAuto, 20, 7168, false).path, CommPath::kTwoShot);
  EXPECT_EQ(choose_all_reduce(l, CommAlgorithm::kAuto, 24, 7168, true).path, CommPath::kTwoShot);
  // Half the width: the same payload at twice the rows.
  l.one_shot_rows = 64;
  EXPECT_EQ(choose_all_reduce(l, CommAlgorithm::kAuto, 39, 3584, false).path, CommPath::kOneShot);
  EXPECT_EQ(choose_all_reduce(l, CommAlgorithm::kAuto, 40, 3584, false).path, CommPath::kTwoShot);
  l.team_size = 2;  // no entry: the two-shot moves the same bytes with one hop more
  for (int rows : {1, 16, 21}) EXPECT_EQ(choose_all_reduce(l, CommAlgorithm::kAuto, rows, 7168, false).path, CommPath::kOneShot);
}

// The limits a measured run implies: what each path served, at each width.
CommLimits limits_of(std::span<const PathTimes> run, const PathTimes& row) {
  CommLimits l;
  l.team_size = row.tp;
  l.shares_memory = true;
  l.hidden = row.width;
  l.rows_cap = 64;
  l.gather_row_bytes = row.width * 2;
  l.one_gpu = row.transport == CommTransport::kOneGpu;
  for (const PathTimes& m : run) {
    if (m.tp != row.tp || m.transport != row.transport || m.width != row.width) continue;
    if (m.us[0]) (m.norm ? l.ar_norm_rows : l.one_shot_rows) = std::max(m.norm ? l.ar_norm_rows : l.one_shot_rows, m.rows);
    if (m.us[1]) (m.norm ? l.two_shot_norm_rows : l.two_shot_rows) = 64;
  }
  return l;
}

// The worst auto / best ratio of `table`'s choices over a run's rows.
double worst_ratio(std::span<const PathTimes> run, std::span<const CrossoverEntry> table, std::string* where) {
  double worst = 1.0;
  for (const PathTimes& m : run) {
    if (!m.best()) continue;
    const CommPath p = choose_all_reduce(limits_of(run, m), CommAlgorithm::kAuto, m.rows, m.width, m.norm, table).path;
    const std::optional<double>& t = m.us[static_cast<std::size_t>(p)];
    const double ratio = t ? *t / *m.best() : 1e9;
    if (ratio > worst) {
      worst = ratio;
      *where = "TP " + std::to_string(m.tp) + (m.norm ? " ar_norm" : " all_reduce") + " width " +
               std::to_string(m.width) + " rows " + std::to_string(m.rows) + " took " + comm_path_name(p);
    }
  }
  return worst;
}

// A synthetic run shaped like the measured ones: the one-shot cheapest at few rows
// and growing fastest, the two-shot with a higher floor, stock flat and slow; the
// one-shot served only while its grids fit; 2 % noise.
std::vector<PathTimes> synthetic_run(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> noise(0.99, 1.01);
  std::vector<PathTimes> run;
  for (int tp : {2, 4, 8})
    for (int64_t width : {2048, 4096, 5120, 7168, 8192, 12288, 16384})
      for (bool norm : {false, true})
        for (int rows : {1, 2, 3, 4, 6, 8, 12, 16, 20, 23, 24, 28, 32, 40, 47, 48, 56, 64}) {
          const double kb = static_cast<double>(rows * width * 2) / 1024.0;
          PathTimes m{tp, CommTransport::kOneGpu, norm, width, rows, {}};
          const int resident = static_cast<int>(528 * 8 / tp / (width / 1024)) / (norm ? 3 : 1);
          if (rows <= resident) m.us[0] = (5.0 + 0.02 * kb * tp) * noise(rng);
          if (width % (8 * tp) == 0) m.us[1] = (7.0 + 0.012 * kb * tp) * noise(rng);
          m.us[2] = (9.0 + 0.011 * kb * tp) * noise(rng);
          run.push_back(m);
        }
  return run;
}

TEST(Crossover, AFittedTableIsWithinThreePercentOfTheFastestOnEveryMeasuredRow) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    const std::vector<PathTimes> run = synthetic_run(seed);
    const std::vector<CrossoverEntry> table = fit_crossover(run);
    std::string where;
    EXPECT_LE(worst_ratio(run, table, &where), 1.03) << where;
    // The compiled table, which knows nothing of this run, does worse: the check has teeth.
    EXPECT_GT(worst_ratio(run, kCrossover, &where), 1.03);
    // Every entry of the fit prints as a line of the table.
    EXPECT_EQ(crossover_entry_text({4, CommTransport::kOneGpu, true, 12288, 23, CommPath::kTwoShot}),
              "    {4, CommTransport::kOneGpu, true, 12288, 23, CommPath::kTwoShot},");
    EXPECT_LT(table.size(), run.size() / 3) << "an entry only where the choice changes";
  }
}

TEST(Crossover, TheFitKeepsAPathWhileItStaysWithinTheTolerance) {
  // One-shot 9, 10.1, 10.12 (within 1.5 % of the two-shot's 10.0 at rows 2 and 4),
  // then 12 against 10: one entry for the one-shot, one where it falls behind.
  std::vector<PathTimes> run;
  const double one[] = {9.0, 10.1, 10.12, 12.0}, two[] = {10.0, 10.0, 10.0, 10.0};
  for (int i = 0; i < 4; ++i) run.push_back({4, CommTransport::kNvlink, false, 4096, 1 << i, {one[i], two[i], 20.0}});
  const std::vector<CrossoverEntry> table = fit_crossover(run);
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table[0].rows, 1);
  EXPECT_EQ(table[0].path, CommPath::kOneShot);
  EXPECT_EQ(table[1].rows, 8);
  EXPECT_EQ(table[1].path, CommPath::kTwoShot);
}

TEST(Crossover, RecordedRunsAreWithinThreePercentOfTheFastestOnEveryRow) {
  const std::filesystem::path dir = TPDECODE_TEST_DATA_DIR "/bench_comm";
  int files = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().extension() != ".json") continue;
    ++files;
    const std::vector<PathTimes> run = read_bench_comm_json(f.path().string());
    std::string where;
    EXPECT_LE(worst_ratio(run, kCrossover, &where), 1.03) << f.path() << ": " << where;
  }
  if (files == 0) GTEST_SKIP() << "no bench comm run recorded in " << dir;
}

}  // namespace
}  // namespace tpdecode
