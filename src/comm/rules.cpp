#include "comm/rules.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "comm/crossover.hpp"
#include "comm/kernels.hpp"
#include "core/check.hpp"

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

// bf16, non-null, contiguous, rows 16-byte aligned, [rows, cols].
void check_bf16_rows(const TensorView& t, int64_t rows, int64_t cols, const char* op, const char* what) {
  check(t.data != nullptr, "{}: {} is null", op, what);
  check(t.dtype == DType::kBF16, "{}: {} has dtype {}, bf16 is required", op, what, dtype_name(t.dtype));
  check(t.rows == rows && t.cols == cols, "{}: {} is [{}, {}], [{}, {}] is required", op, what, t.rows, t.cols, rows,
        cols);
  check(t.contiguous(), "{}: {} must be contiguous ({})", op, what, t.describe());
  check(t.aligned(16), "{}: {} must be 16-byte aligned", op, what);
}

void check_rows(int64_t rows, const char* op) { check(rows >= 1, "{}: {} rows (at least 1)", op, rows); }

}  // namespace

void check_norm_eps(float eps, const char* op) {
  check(std::isfinite(eps) && eps >= 0.0f, "{}: eps {} (a finite number >= 0 is required)", op, eps);
}

void check_all_reduce(const AllReduceIo& io) {
  check_rows(io.x.rows, "all_reduce");
  check(io.x.cols >= 8 && io.x.cols % 8 == 0, "all_reduce: {} columns, must be a positive multiple of 8", io.x.cols);
  check_bf16_rows(io.x, io.x.rows, io.x.cols, "all_reduce", "input");
  check_bf16_rows(io.out, io.x.rows, io.x.cols, "all_reduce", "output");
}

void check_ar_norm(const ArNormIo& io) {
  const int64_t rows = io.x.rows;
  const int64_t hidden = io.x.cols;
  check_rows(rows, "ar_norm");
  check_norm_eps(io.eps, "ar_norm");
  check(ar_norm_hidden_served(hidden), "ar_norm: hidden {}: the norm kernels take multiples of 64 up to {}", hidden,
        kArNormMaxHidden);
  check_bf16_rows(io.x, rows, hidden, "ar_norm", "input");
  if (io.residual.data) check_bf16_rows(io.residual, rows, hidden, "ar_norm", "residual");
  check_bf16_rows(io.weight, 1, hidden, "ar_norm", "weight");
  check_bf16_rows(io.out, rows, hidden, "ar_norm", "output");
  check_bf16_rows(io.residual_out, rows, hidden, "ar_norm", "residual output");
}

void check_gather(const GatherIo& io, int team_size) {
  const TensorView& s = io.shard;
  check_rows(s.rows, "gather");
  check(s.data != nullptr && io.out.data != nullptr, "gather: null shard or output");
  // Why not aligned(16): rows of any multiple of 4 bytes are taken (the stock path
  // moves words); the mailbox serves rows of whole 16-byte fragments.
  const auto starts_aligned = [](const TensorView& t) { return reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0; };
  check(s.contiguous() && starts_aligned(s), "gather: shard must be contiguous and start 16-byte aligned ({})",
        s.describe());
  const int64_t bytes = s.cols * static_cast<int64_t>(s.element_size());
  check(bytes > 0 && bytes % 4 == 0, "gather: shard rows of {} bytes, must be a positive multiple of 4", bytes);
  check(io.out.dtype == s.dtype && io.out.rows == s.rows && io.out.cols == s.cols * team_size,
        "gather: output {} for shard {} of a team of {} (needs {}[{}, {}])", io.out.describe(), s.describe(),
        team_size, dtype_name(s.dtype), s.rows, s.cols * team_size);
  check(io.out.contiguous() && starts_aligned(io.out), "gather: output must be contiguous and start 16-byte aligned");
}

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

std::string two_shot_refusal(const CommLimits& limits, int64_t rows, int64_t width, bool norm) {
  if (std::string why = team_refusal(limits); !why.empty()) return why;
  const char* op = norm ? "two-shot ar_norm" : "two-shot all_reduce";
  if (norm && !ar_norm_hidden_served(width))
    return fmt::format("{}: hidden {}, the row norm takes multiples of 64 up to {}", op, width, kArNormMaxHidden);
  const int64_t chunk = 8 * static_cast<int64_t>(limits.team_size);
  if (width % chunk != 0)
    return fmt::format("{}: {} columns, not a multiple of 8 · TP = {} (every owner takes whole 16-byte chunks)", op,
                       width, chunk);
  if (width > limits.hidden) return fmt::format("{}: {} columns, the mailbox rows hold {}", op, width, limits.hidden);
  const int served = norm ? limits.two_shot_norm_rows : limits.two_shot_rows;
  if (served == 0) return fmt::format("{}: not one of its grids per rank fits on this GPU", op);
  return rows_refusal(limits, rows, served, op);
}

std::pair<int, int> two_shot_rows_for(const CommLimits& limits, int64_t width, bool norm) {
  const CommTransport transport = limits.one_gpu ? CommTransport::kOneGpu : CommTransport::kNvlink;
  const CrossoverPoint* nearest = nullptr;
  // Nearest width by ratio, so 4096 and 8192 are as far from 5792.
  const auto distance = [&](const CrossoverPoint& c) {
    return std::abs(std::log(static_cast<double>(c.width) / static_cast<double>(width)));
  };
  for (const CrossoverPoint& c : kCrossover)
    if (c.tp == limits.team_size && c.transport == transport && c.norm == norm &&
        (nearest == nullptr || distance(c) < distance(*nearest)))
      nearest = &c;
  if (nearest == nullptr || nearest->from >= kNever) return {kNever, kNever};
  // Why scaled: the crossover sits at a fixed payload (rows × width).
  const auto scale = [&](int rows) {
    if (rows >= kNever) return kNever;
    const int64_t scaled = (static_cast<int64_t>(rows) * nearest->width + width - 1) / width;
    return static_cast<int>(std::clamp<int64_t>(scaled, 1, kNever));
  };
  return {scale(nearest->from), scale(nearest->to)};
}

CommResult choose_all_reduce(const CommLimits& limits, CommAlgorithm algorithm, int64_t rows, int64_t width, bool norm) {
  if (algorithm == CommAlgorithm::kStock) return {CommPath::kStock, "the stock path was asked for"};
  std::string one = norm ? ar_norm_refusal(limits, rows, width) : one_shot_refusal(limits, rows, width);
  std::string two = two_shot_refusal(limits, rows, width, norm);
  if (algorithm == CommAlgorithm::kOneShot)
    return one.empty() ? CommResult{CommPath::kOneShot, {}} : CommResult{CommPath::kStock, std::move(one)};
  if (algorithm == CommAlgorithm::kTwoShot)
    return two.empty() ? CommResult{CommPath::kTwoShot, {}} : CommResult{CommPath::kStock, std::move(two)};
  const auto [from, to] = two_shot_rows_for(limits, width, norm);
  if (two.empty() && rows >= from && rows <= to) return {CommPath::kTwoShot, {}};
  if (one.empty()) return {CommPath::kOneShot, {}};
  if (two.empty())
    two = fmt::format("{}: {} rows, where it was not measured faster than the stock path",
                      norm ? "two-shot ar_norm" : "two-shot all_reduce", rows);
  return {CommPath::kStock, one == two ? std::move(one) : fmt::format("{}; {}", one, two)};
}

}  // namespace tpdecode
