#include <fmt/format.h>

#include <exception>

#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"tpdecode: decode-time tensor-parallel building blocks (collectives, decode GEMM, drafter step)"};
  app.require_subcommand(1);
  tpdecode::cli::register_info(app);
  tpdecode::cli::register_bench_gemm(app);
  tpdecode::cli::register_bench_chain(app);
  tpdecode::cli::register_tune(app);
  tpdecode::cli::register_bench_comm(app);
  tpdecode::cli::register_drafter(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    fmt::print(stderr, "tpdecode: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
