#include "comm/crossover_fit.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "tpdecode/error.hpp"

namespace tpdecode {

std::optional<double> PathTimes::best() const {
  std::optional<double> b;
  for (const std::optional<double>& t : us)
    if (t && (!b || *t < *b)) b = t;
  return b;
}

namespace {

constexpr CommPath kPaths[] = {CommPath::kOneShot, CommPath::kTwoShot, CommPath::kStock};

bool within(const PathTimes& m, CommPath p, double tolerance) {
  const std::optional<double>& t = m.us[static_cast<std::size_t>(p)];
  return t && *t <= *m.best() * (1.0 + tolerance);
}

// How many rows from `from` on path p stays within the tolerance.
std::size_t run_length(std::span<const PathTimes* const> rows, std::size_t from, CommPath p, double tolerance) {
  std::size_t n = 0;
  while (from + n < rows.size() && within(*rows[from + n], p, tolerance)) ++n;
  return n;
}

}  // namespace

std::vector<CrossoverEntry> fit_crossover(std::span<const PathTimes> measured, double tolerance) {
  using Key = std::tuple<int, CommTransport, bool, int64_t>;
  std::map<Key, std::vector<const PathTimes*>> keys;
  for (const PathTimes& m : measured)
    if (m.best()) keys[{m.tp, m.transport, m.norm, m.width}].push_back(&m);
  std::vector<CrossoverEntry> entries;
  for (auto& [key, rows] : keys) {
    std::sort(rows.begin(), rows.end(), [](const PathTimes* a, const PathTimes* b) { return a->rows < b->rows; });
    std::optional<CommPath> current;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (current && within(*rows[i], *current, tolerance)) continue;
      CommPath pick = CommPath::kStock;
      std::size_t longest = 0;
      for (CommPath p : kPaths) {
        const std::size_t n = run_length(rows, i, p, tolerance);
        if (n > longest) {
          longest = n;
          pick = p;
        }
      }
      current = pick;
      const auto& [tp, transport, norm, width] = key;
      entries.push_back({tp, transport, norm, width, rows[i]->rows, pick});
    }
  }
  return entries;
}

std::string crossover_entry_text(const CrossoverEntry& e) {
  const char* path = e.path == CommPath::kOneShot ? "kOneShot" : e.path == CommPath::kTwoShot ? "kTwoShot" : "kStock";
  return fmt::format("    {{{}, CommTransport::{}, {}, {}, {}, CommPath::{}}},", e.tp,
                     e.transport == CommTransport::kOneGpu ? "kOneGpu" : "kNvlink", e.norm ? "true" : "false", e.width,
                     e.rows, path);
}

std::vector<PathTimes> read_bench_comm_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("{}: cannot be read", path));
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not JSON ({})", path, e.what()));
  }
  const CommTransport transport = j.value("team", "") == "local" ? CommTransport::kOneGpu : CommTransport::kNvlink;
  std::vector<PathTimes> out;
  for (const nlohmann::json& r : j.at("rows")) {
    const std::string op = r.at("op");
    if (op != "all_reduce" && op != "ar_norm") continue;
    PathTimes m;
    m.tp = r.at("tp");
    m.transport = transport;
    m.norm = op == "ar_norm";
    m.width = r.at("hidden");
    m.rows = r.at("rows");
    for (CommPath p : kPaths) {
      const nlohmann::json& cell = r.at(comm_path_name(p));
      if (cell.contains("us")) m.us[static_cast<std::size_t>(p)] = cell.at("us").get<double>();
    }
    out.push_back(m);
  }
  return out;
}

}  // namespace tpdecode
