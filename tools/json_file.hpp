// Writing a command's --json file: all of it, or an error naming the path.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace tpdecode::cli {

// Throws tpdecode::Error when `path` cannot be written completely.
void write_json_file(const std::string& path, const nlohmann::json& j);

}  // namespace tpdecode::cli
