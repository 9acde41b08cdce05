// The subcommands of the tpdecode tool; each registers itself on the app.
#pragma once

#include <CLI/CLI.hpp>

namespace tpdecode::cli {

void register_info(CLI::App& app);

}  // namespace tpdecode::cli
