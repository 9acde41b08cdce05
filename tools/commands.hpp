// The subcommands of the tpdecode tool; each registers itself on the app.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <string>

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
        if (end == text.c_str() || *end != '\0' || !std::isfinite(v) || v < 0)
          return what + " " + text + ": a finite number >= 0 is required";
        return {};
      },
      "FINITE >= 0");
}

inline CLI::App* bench_group(CLI::App& app) {
  return command_group(app, "bench", "benchmarks: tables of ours vs stock, --json");
}
// Apart from the product commands: instruments for designing engines.
inline CLI::App* lab_group(CLI::App& app) {
  return command_group(app, "lab", "lab instruments for engine design (not benchmarks of the library)");
}

}  // namespace tpdecode::cli
