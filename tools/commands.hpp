// The subcommands of the tpdecode tool; each registers itself on the app.
#pragma once

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace tpdecode::cli {

void register_info(CLI::App& app);
void register_bench_gemm(CLI::App& app);
void register_bench_chain(CLI::App& app);
void register_tune(CLI::App& app);
void register_bench_comm(CLI::App& app);
void register_bench_oproj(CLI::App& app);
void register_drafter(CLI::App& app);
// Lab instruments (engine design, not the library's benchmarks): tools/lab/.
void register_lab_loads(CLI::App& app);
void register_lab_launches(CLI::App& app);

// A group of subcommands, created by whichever of its commands registers first.
inline CLI::App* command_group(CLI::App& app, const char* name, const char* description) {
  try {
    return app.get_subcommand(name);
  } catch (const CLI::OptionNotFound&) {
    CLI::App* group = app.add_subcommand(name, description);
    group->require_subcommand(1);
    return group;
  }
}

// An option's check: its value is a finite number >= 0 (an RMSNorm's eps).
inline CLI::Validator finite_non_negative(const std::string& what) {
  return CLI::Validator(
      [what](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        // Why FLT_MAX: the option is a float; a larger double would become inf.
        if (end == text.c_str() || *end != '\0' || !std::isfinite(v) || v < 0 || v > FLT_MAX)
          return what + " " + text + ": a finite number >= 0 is required";
        return {};
      },
      "FINITE >= 0");
}

// An output file's check, before anything runs (a benchmark's --json would otherwise
// fail only after the whole run): a file that exists and can be written (/dev/null
// too), or a new name in a folder that exists and can be written. `replaced`: the
// file is written as a new file renamed over the old one (the tuning cache), so its
// folder must be writable even where the file exists.
inline CLI::Validator writable_file(bool replaced = false) {
  return CLI::Validator(
      [replaced](std::string& path) -> std::string {
        if (path.empty()) return "an empty file name";
        const std::filesystem::path p(path);
        std::error_code e;
        if (std::filesystem::is_directory(p, e)) return path + " is a folder";
        const bool exists = std::filesystem::exists(p, e);
        if (exists && !replaced) return ::access(path.c_str(), W_OK) == 0 ? "" : path + " cannot be written";
        const std::filesystem::path folder = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
        if (!std::filesystem::is_directory(folder, e))
          return "the folder of " + path + " does not exist (or cannot be reached)";
        if (::access(folder.c_str(), W_OK) != 0) return "the folder of " + path + " cannot be written";
        return {};
      },
      replaced ? "WRITABLE FOLDER" : "WRITABLE FILE");
}

// A count's check: 1 .. 100000 (timed replays, calls).
inline CLI::Range positive_count() { return CLI::Range(1, 100000); }

// A repeatable option's values with repeats dropped, first occurrences in order (a row
// counted twice would count twice in a benchmark's targets).
template <class T>
std::vector<T> unique_in_order(const std::vector<T>& values) {
  std::vector<T> out;
  for (const T& v : values)
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  return out;
}

inline CLI::App* bench_group(CLI::App& app) {
  return command_group(app, "bench", "benchmarks: tables of ours vs stock, --json");
}
// Apart from the product commands: instruments for designing engines.
inline CLI::App* lab_group(CLI::App& app) {
  return command_group(app, "lab", "lab instruments for engine design (not benchmarks of the library)");
}

}  // namespace tpdecode::cli
