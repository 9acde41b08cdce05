// crossover.hpp's entries from a measured run: what `tpdecode bench comm --fit`
// prints and the CPU tests check the table against. Not used by any call: the
// table is compiled in; this only writes and checks it.
#pragma once

#include <array>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/crossover.hpp"

namespace tpdecode {

// One measured row of `bench comm` (all_reduce or ar_norm): µs per call of each
// path, by CommPath; nullopt where the path did not serve it.
struct PathTimes {
  int tp = 0;
  CommTransport transport = CommTransport::kOneGpu;
  bool norm = false;
  int64_t width = 0;
  int rows = 0;
  std::array<std::optional<double>, 3> us;

  // The fastest path's time (nullopt where none was timed).
  std::optional<double> best() const;
};

// The entries of every measured (tp, transport, op, width): along the rows in
// order, the path kept as long as it is within `tolerance` of the fastest, else the
// path among those within it that stays there longest (ties: one-shot, two-shot,
// stock); an entry at each key's first row and at every change.
std::vector<CrossoverEntry> fit_crossover(std::span<const PathTimes> measured, double tolerance = 0.015);

// An entry as a line of crossover.hpp's table.
std::string crossover_entry_text(const CrossoverEntry& e);

// The all_reduce and ar_norm rows of a `bench comm --json` file (Error if it cannot
// be read); the other ops' rows are left out.
std::vector<PathTimes> read_bench_comm_json(const std::string& path);

}  // namespace tpdecode
