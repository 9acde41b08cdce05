// The tpdecode command-line tool: info, benchmarks and the drafter step.
#include <fmt/format.h>

#include <exception>
#include <string>

#include "commands.hpp"
#include "tpdecode/version.hpp"

namespace {

// The subcommand names of `app`, comma-separated.
std::string names(CLI::App& app) {
  std::string out;
  for (const CLI::App* sub : app.get_subcommands({})) out += (out.empty() ? "" : ", ") + sub->get_name();
  return out;
}

// Why: CLI11 reports an unknown subcommand as a missing one; say which word it did
// not know and what it knows.
void refuse_unknown_subcommand(CLI::App& app, int argc, char** argv) {
  CLI::App* level = &app;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') return;
    CLI::App* next = nullptr;
    for (CLI::App* sub : level->get_subcommands({}))
      if (sub->get_name() == word) next = sub;
    if (next == nullptr) {
      if (level->get_subcommands({}).empty()) return;  // a positional argument of a leaf command
      throw CLI::ValidationError(fmt::format("unknown subcommand '{}' (expected one of: {})", word, names(*level)));
    }
    level = next;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tpdecode: decode-time tensor-parallel building blocks (collectives, decode GEMM, drafter step)"};
  app.set_version_flag("--version", std::string("tpdecode ") + tpdecode::version());
  app.require_subcommand(1);
  tpdecode::cli::register_info(app);
  tpdecode::cli::register_bench_gemm(app);
  tpdecode::cli::register_bench_chain(app);
  tpdecode::cli::register_tune(app);
  tpdecode::cli::register_bench_comm(app);
  tpdecode::cli::register_bench_oproj(app);
  tpdecode::cli::register_drafter(app);
  tpdecode::cli::register_lab_loads(app);
  tpdecode::cli::register_lab_launches(app);
  try {
    refuse_unknown_subcommand(app, argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    fmt::print(stderr, "tpdecode: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
