#include "comm/rules.hpp"

#include <fmt/format.h>

#include "comm/kernels.hpp"

namespace tpdecode {
namespace {

std::string team_refusal(const CommLimits& limits) {
  if (limits.team_size < 2) return "TP 1: nothing to communicate";
  if (!limits.shares_memory) return "the ranks do not share memory (not one NVLink domain): NCCL serves every call";
  return {};
}

std::string rows_refusal(const CommLimits& limits, int64_t rows, int resident, const char* op) {
  if (rows > limits.rows_cap) return fmt::format("{}: {} rows, the mailboxes hold {}", op, rows, limits.rows_cap);
  if (rows > resident)
    return fmt::format("{}: {} rows, the ranks on this GPU can hold {} rows' grids at once", op, rows, resident);
  return {};
}

}  // namespace

std::string one_shot_refusal(const CommLimits& limits, int64_t rows, int64_t width) {
  if (std::string why = team_refusal(limits); !why.empty()) return why;
  if (width % 8 != 0) return fmt::format("all_reduce: {} columns, not whole 16-byte fragments", width);
  if (width > limits.hidden) return fmt::format("all_reduce: {} columns, the mailbox rows hold {}", width, limits.hidden);
  return rows_refusal(limits, rows, limits.one_shot_rows, "all_reduce");
}

std::string ar_norm_refusal(const CommLimits& limits, int64_t rows, int64_t hidden) {
  if (std::string why = team_refusal(limits); !why.empty()) return why;
  if (!ar_norm_hidden_served(hidden))
    return fmt::format("ar_norm: hidden {}, the row norm takes multiples of 64 up to {}", hidden, kArNormMaxHidden);
  if (hidden > limits.hidden) return fmt::format("ar_norm: hidden {}, the mailbox rows hold {}", hidden, limits.hidden);
  return rows_refusal(limits, rows, limits.ar_norm_rows, "ar_norm");
}

std::string gather_refusal(const CommLimits& limits, int64_t rows, int64_t shard_bytes, DType dtype) {
  if (std::string why = team_refusal(limits); !why.empty()) return why;
  if (dtype == DType::kI32) return "gather: i32 data is not served (the sentinel word 0x80000000 is INT_MIN)";
  if (shard_bytes % 16 != 0) return fmt::format("gather: shard rows of {} bytes, not whole 16-byte fragments", shard_bytes);
  if (shard_bytes * limits.team_size > limits.gather_row_bytes)
    return fmt::format("gather: {} ranks x {} bytes, the mailbox rows hold {}", limits.team_size, shard_bytes,
                       limits.gather_row_bytes);
  return rows_refusal(limits, rows, limits.gather_rows, "gather");
}

CommResult choose_all_reduce(const CommLimits& limits, CommAlgorithm algorithm, int64_t rows, int64_t width, bool norm) {
  if (algorithm == CommAlgorithm::kStock) return {CommPath::kStock, "the stock path was asked for"};
  std::string why = norm ? ar_norm_refusal(limits, rows, width) : one_shot_refusal(limits, rows, width);
  if (why.empty()) return {CommPath::kOneShot, {}};
  return {CommPath::kStock, std::move(why)};
}

}  // namespace tpdecode
