#include "gemm/tune_file.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.hpp"
#include "gemm/gemm_tactic.hpp"
#include "tpdecode/gemm_tuner.hpp"

namespace tpdecode {
namespace {

constexpr const char* kFormat = "tpdecode-gemm-tune/1";
using Json = nlohmann::json;

std::string hex_of(const CublasLtAlgo& a) {
  std::string s;
  for (uint64_t w : a) s += fmt::format("{:016x}", w);
  return s;
}

CublasLtAlgo algo_of_hex(const std::string& s) {
  check<Error>(s.size() == 16 * std::tuple_size_v<CublasLtAlgo>, "lt_algo has {} hex digits", s.size());
  CublasLtAlgo a{};
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string word = s.substr(16 * i, 16);
    check<Error>(word.find_first_not_of("0123456789abcdef") == std::string::npos, "lt_algo is not hex");
    a[i] = std::stoull(word, nullptr, 16);
  }
  return a;
}

std::optional<GemmPath> path_of(const std::string& name) {
  for (GemmPath p : {GemmPath::kWarpSplitK, GemmPath::kCublas, GemmPath::kCublasLt, GemmPath::kWgmma, GemmPath::kWgmmaWide})
    if (name == gemm_path_name(p)) return p;
  return std::nullopt;
}

DType dtype_of(const std::string& name) {
  for (DType t : {DType::kBF16, DType::kF32, DType::kI32})
    if (name == dtype_name(t)) return t;
  throw Error(fmt::format("unknown dtype \"{}\"", name));
}

template <class T>
T small_unsigned(const Json& e, const char* field, int64_t max) {
  const int64_t v = e.at(field).get<int64_t>();
  check<Error>(v >= 0 && v <= max, "{} = {} is out of range", field, v);
  return static_cast<T>(v);
}

// The entry; none where its path is one this library no longer has, or its rows are
// not one of our buckets (a file written by another version: its key's version never
// matches this one's).
std::optional<TuneEntry> entry_of(const Json& e) {
  const std::optional<GemmPath> path = path_of(e.at("path").get<std::string>());
  if (!path) return std::nullopt;
  TuneEntry t;
  t.key.device = e.at("device").get<std::string>();
  t.key.sms = small_unsigned<int>(e, "sms", 1 << 16);
  t.key.version = e.at("version").get<std::string>();
  t.key.n = e.at("n").get<int64_t>();
  t.key.k = e.at("k").get<int64_t>();
  check<Error>(t.key.n > 0 && t.key.k > 0, "n, k must be positive");
  const int m_min = e.at("m_min").get<int>();
  const int m_max = e.at("m_max").get<int>();
  check<Error>(m_min >= 1 && m_max <= kGemmMaxRows && m_min <= m_max, "m_min, m_max = {}, {}", m_min, m_max);
  t.key.bucket = gemm_m_bucket(m_min);
  t.key.dtype = dtype_of(e.at("dtype").get<std::string>());
  t.key.chain = e.value("chain", false);  // absent in files written before chain decisions
  t.key.sharing = e.value("sharing", 1);  // absent in files written before shared-GPU decisions
  check<Error>(t.key.sharing >= 1 && t.key.sharing <= 64, "sharing {}", t.key.sharing);
  t.key.invariant = e.value("invariant", false);  // absent in files written before batch-invariant tuning
  t.decision.path = *path;
  t.decision.source = GemmSource::kCache;
  t.decision.split = small_unsigned<uint8_t>(e, "split", 255);
  // Absent in files written before the wgmma engine; 0 for the warp engine in files
  // written before its narrow CTAs, whose CTAs were the wide ones (4 row tiles).
  t.decision.sub_tiles = e.contains("sub_tiles") ? small_unsigned<uint8_t>(e, "sub_tiles", 255) : uint8_t{0};
  if (*path == GemmPath::kWarpSplitK && t.decision.sub_tiles == 0) t.decision.sub_tiles = kWarpWarps;
  t.decision.stages = e.contains("stages") ? small_unsigned<uint8_t>(e, "stages", 255) : uint8_t{0};
  t.decision.clusters = e.contains("clusters") ? small_unsigned<uint16_t>(e, "clusters", 65535) : uint16_t{0};
  t.decision.lt_algo = algo_of_hex(e.at("lt_algo").get<std::string>());
  t.decision.measured_us = e.at("us").get<float>();
  t.decision.tune_ms = e.at("tune_ms").get<float>();
  // Absent in files written before the two-phase decision.
  t.decision.tune_finalists = e.contains("finalists") ? small_unsigned<uint8_t>(e, "finalists", 255) : uint8_t{0};
  t.decision.tune_rounds = e.contains("rounds") ? small_unsigned<uint8_t>(e, "rounds", 255) : uint8_t{0};
  t.decision.tune_stable = e.value("stable", false);
  if (gemm_bucket_min(t.key.bucket) != m_min || gemm_bucket_max(t.key.bucket) != m_max) {
    // Rows another version bucketed otherwise: skipped with that version's entries.
    check<Error>(t.key.version != gemm_library_version(), "m {}-{} is not a bucket", m_min, m_max);
    return std::nullopt;
  }
  return t;
}

Json json_of(const TuneEntry& t) {
  return {{"device", t.key.device},
          {"sms", t.key.sms},
          {"version", t.key.version},
          {"n", t.key.n},
          {"k", t.key.k},
          {"m_min", gemm_bucket_min(t.key.bucket)},
          {"m_max", gemm_bucket_max(t.key.bucket)},
          {"dtype", dtype_name(t.key.dtype)},
          {"chain", t.key.chain},
          {"sharing", t.key.sharing},
          {"invariant", t.key.invariant},
          {"path", gemm_path_name(t.decision.path)},
          {"split", t.decision.split},
          {"sub_tiles", t.decision.sub_tiles},
          {"stages", t.decision.stages},
          {"clusters", t.decision.clusters},
          {"lt_algo", hex_of(t.decision.lt_algo)},
          {"us", t.decision.measured_us},
          {"tune_ms", t.decision.tune_ms},
          {"finalists", t.decision.tune_finalists},
          {"rounds", t.decision.tune_rounds},
          {"stable", t.decision.tune_stable}};
}

}  // namespace

std::vector<TuneEntry> read_tune_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  std::ifstream in(path);
  check<Error>(in.good(), "cannot open {}", path);
  std::stringstream text;
  text << in.rdbuf();
  std::vector<TuneEntry> entries;
  try {
    const Json j = Json::parse(text.str());
    check<Error>(j.is_object() && j.value("format", std::string{}) == kFormat, "not a {} file", kFormat);
    for (const Json& e : j.at("entries"))
      if (std::optional<TuneEntry> t = entry_of(e)) entries.push_back(*t);
  } catch (const Json::exception& e) {
    throw Error(fmt::format("{}: {}", path, e.what()));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path, e.what()));
  }
  return entries;
}

void write_tune_file(const std::string& path, const std::vector<TuneEntry>& entries) {
  Json j;
  j["format"] = kFormat;
  j["entries"] = Json::array();
  for (const TuneEntry& t : entries) j["entries"].push_back(json_of(t));
  // Why a unique temporary name: ranks in several processes may save at once; each
  // rename is atomic, so readers always see one whole file.
  static std::atomic<int> serial{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), serial++);
  {
    std::ofstream out(tmp);
    out << j.dump(1) << "\n";
    check<Error>(out.good(), "cannot write {}", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw Error(fmt::format("cannot replace {}", path));
  }
}

}  // namespace tpdecode
