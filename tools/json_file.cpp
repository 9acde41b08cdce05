#include "json_file.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "tpdecode/error.hpp"

namespace tpdecode::cli {

void write_json_file(const std::string& path, const nlohmann::json& j) {
  std::ofstream f(path);
  f << j.dump(2) << "\n";
  f.close();
  if (!f) throw Error(fmt::format("could not write {}: {}", path, std::strerror(errno)));
}

}  // namespace tpdecode::cli
