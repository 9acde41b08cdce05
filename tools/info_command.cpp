// tpdecode info: the machine, as the kernels see it.
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "tpdecode/device_info.hpp"

namespace tpdecode::cli {
namespace {

std::string attribute(int v) { return v < 0 ? "unreadable" : v ? "yes" : "no"; }

std::string version(int code) {  // NCCL: 22809 -> 2.28.9; CUDA: 13000 -> 13.0
  if (code <= 0) return "none";
  if (code >= 10000 && code < 20000) return fmt::format("{}.{}", code / 1000, code % 1000 / 10);
  return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
}

void print_table(const SystemInfo& s) {
  fmt::print("tpdecode info\n");
  fmt::print("CUDA runtime {}, driver {}, NCCL {}\n", version(s.runtime_version),
             s.driver_version ? version(s.driver_version) : "none", version(s.nccl_version));
  if (s.gpus.empty()) {
    fmt::print("No GPU: {}.\n", s.no_gpu_reason);
  } else {
    fmt::print("\n{:>3}  {:<24} {:>4} {:>5} {:>9} {:>7} {:>8} {:>4} {:>9}\n", "gpu", "name", "sm", "SMs", "memory",
               "L2", "clusters", "VMM", "multicast");
    for (const GpuInfo& g : s.gpus)
      fmt::print("{:>3}  {:<24} {:>2}{:<2} {:>5} {:>6.1f}GiB {:>5}MB {:>8} {:>4} {:>9}\n", g.index, g.name, g.cc_major,
                 g.cc_minor, g.sms, g.memory_bytes / 1073741824.0, g.l2_bytes >> 20, g.cluster_launch ? "yes" : "no",
                 attribute(g.vmm), attribute(g.multicast));
    fmt::print("\npeer access (row can access column):\n     ");
    for (std::size_t j = 0; j < s.gpus.size(); ++j) fmt::print("{:>4}", j);
    fmt::print("\n");
    for (std::size_t i = 0; i < s.gpus.size(); ++i) {
      fmt::print("{:>4} ", i);
      for (std::size_t j = 0; j < s.gpus.size(); ++j) fmt::print("{:>4}", i == j ? "-" : s.peer_access[i][j] ? "yes" : "no");
      fmt::print("\n");
    }
  }
  fmt::print("\nbackends:\n");
  for (const Backend& b : s.backends) fmt::print("  {:<22} {:<10} {}\n", b.name, b.serves ? "serves" : "not served", b.why);
}

nlohmann::json to_json(const SystemInfo& s) {
  nlohmann::json j;
  j["cuda_runtime"] = s.runtime_version;
  j["cuda_driver"] = s.driver_version;
  j["nccl_version"] = s.nccl_version;
  j["no_gpu_reason"] = s.no_gpu_reason;
  j["gpus"] = nlohmann::json::array();
  for (const GpuInfo& g : s.gpus)
    j["gpus"].push_back({{"index", g.index},
                         {"name", g.name},
                         {"compute_capability", fmt::format("{}.{}", g.cc_major, g.cc_minor)},
                         {"sms", g.sms},
                         {"memory_bytes", g.memory_bytes},
                         {"l2_bytes", g.l2_bytes},
                         {"cluster_launch", g.cluster_launch},
                         {"vmm", g.vmm},
                         {"multicast_supported", g.multicast}});
  j["peer_access"] = s.peer_access;
  j["backends"] = nlohmann::json::array();
  for (const Backend& b : s.backends) j["backends"].push_back({{"name", b.name}, {"serves", b.serves}, {"why", b.why}});
  return j;
}

}  // namespace

void register_info(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("info", "GPUs, peer access, VMM/multicast attributes, NCCL, backends");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "print JSON instead of a table");
  cmd->callback([json] {
    const SystemInfo s = query_system();
    if (*json)
      std::cout << to_json(s).dump(2) << "\n";
    else
      print_table(s);
  });
}

}  // namespace tpdecode::cli
