// The subcommands of the tpdecode tool; each registers itself on the app.
#pragma once

#include <CLI/CLI.hpp>

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

}  // namespace tpdecode::cli
