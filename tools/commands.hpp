// The subcommands of the tpdecode tool; each registers itself on the app.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <string>

namespace tpdecode::cli {

void register_info(CLI::App& app);
void register_bench_gemm(CLI::App& app);
void register_bench_loads(CLI::App& app);
void register_bench_chain(CLI::App& app);
void register_tune(CLI::App& app);
void register_bench_comm(CLI::App& app);
void register_bench_oproj(CLI::App& app);
void register_drafter(CLI::App& app);

// The `bench` group (created by whichever benchmark registers first).
inline CLI::App* bench_group(CLI::App& app) {
  try {
    return app.get_subcommand("bench");
  } catch (const CLI::OptionNotFound&) {
    CLI::App* bench = app.add_subcommand("bench", "benchmarks: tables of ours vs stock, --json");
    bench->require_subcommand(1);
    return bench;
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

}  // namespace tpdecode::cli
