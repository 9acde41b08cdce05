#include "comm/rules.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "comm/crossover.hpp"
#include "comm/kernels.hpp"
#include "core/check.hpp"
#include "core/tensor_overlap.hpp"

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

// Of `dtype`, non-null, contiguous, rows `align`-byte aligned, [rows, cols].
void check_rows_of(const TensorView& t, DType dtype, int64_t rows, int64_t cols, std::size_t align, const char* op,
                   const char* what) {
  check(t.data != nullptr, "{}: {} is null", op, what);
  check(t.dtype == dtype, "{}: {} has dtype {}, {} is required", op, what, dtype_name(t.dtype), dtype_name(dtype));
  check(t.rows == rows && t.cols == cols, "{}: {} is [{}, {}], [{}, {}] is required", op, what, t.rows, t.cols, rows,
        cols);
  check(t.contiguous(), "{}: {} must be contiguous ({})", op, what, t.describe());
  check(t.aligned(align), "{}: {} must be {}-byte aligned", op, what, align);
}

void check_bf16_rows(const TensorView& t, int64_t rows, int64_t cols, const char* op, const char* what) {
  check_rows_of(t, DType::kBF16, rows, cols, 16, op, what);
}

// Why at most INT32_MAX: the stock paths pass the row count as an int.
void check_rows(int64_t rows, const char* op) {
  check(rows >= 1 && rows <= INT32_MAX, "{}: {} rows (1 to {})", op, rows, INT32_MAX);
}

}  // namespace

void check_norm_eps(float eps, const char* op) {
  check(std::isfinite(eps) && eps >= 0.0f, "{}: eps {} (a finite number >= 0 is required)", op, eps);
}

void check_all_reduce(const AllReduceIo& io) {
  check_rows(io.x.rows, "all_reduce");
  check(io.x.cols >= 8 && io.x.cols % 8 == 0, "all_reduce: {} columns, must be a positive multiple of 8", io.x.cols);
  check_bf16_rows(io.x, io.x.rows, io.x.cols, "all_reduce", "input");
  check_bf16_rows(io.out, io.x.rows, io.x.cols, "all_reduce", "output");
  check_writes_apart("all_reduce", {{&io.out, "output", &io.x}}, {{&io.x, "input"}});
}

namespace {

void check_ar_norm_shapes(const ArNormIo& io) {
  const int64_t rows = io.x.rows;
  const int64_t hidden = io.x.cols;
  check_rows(rows, "ar_norm");
  check_norm_eps(io.eps, "ar_norm");
  check(ar_norm_hidden_served(hidden), "ar_norm: hidden {}: the norm kernels take multiples of 64 up to {}", hidden,
        kArNormMaxHidden);
  check_bf16_rows(io.x, rows, hidden, "ar_norm", "input");
  if (io.residual.data) check_bf16_rows(io.residual, rows, hidden, "ar_norm", "residual");
  check_bf16_rows(io.weight, 1, hidden, "ar_norm", "weight");
  check_bf16_rows(io.residual_out, rows, hidden, "ar_norm", "residual output");
  switch (io.quant) {
    case ArNormQuant::kNone:
      check_bf16_rows(io.out, rows, hidden, "ar_norm", "output");
      return;
    case ArNormQuant::kStatic:
      check_rows_of(io.out, DType::kE4M3, rows, hidden, 16, "ar_norm", "fp8 output");
      check_rows_of(io.scale, DType::kF32, 1, 1, 4, "ar_norm", "static scale");
      return;
    case ArNormQuant::kGroup:
    case ArNormQuant::kGroupUe8m0:
      check(ar_norm_group_quant_served(hidden),
            "ar_norm: hidden {}: the group quantisation takes multiples of {} (each group of {} columns inside one "
            "of the 8 CTAs that hold a row)",
            hidden, 8 * kArNormQuantGroup, kArNormQuantGroup);
      check_rows_of(io.out, DType::kE4M3, rows, hidden, 16, "ar_norm", "fp8 output");
      check_rows_of(io.scale, DType::kF32, rows, hidden / kArNormQuantGroup, 4, "ar_norm", "group scales");
      return;
  }
  check(false, "ar_norm: quantisation {} unknown", static_cast<int>(io.quant));
}

}  // namespace

void check_ar_norm(const ArNormIo& io) {
  check_ar_norm_shapes(io);
  // The new residual may be the residual itself (in place); a static scale is read,
  // group scales are written.
  const bool group = io.quant == ArNormQuant::kGroup || io.quant == ArNormQuant::kGroupUe8m0;
  const TensorView none{};
  check_writes_apart("ar_norm",
                     {{&io.out, "output"},
                      {&io.residual_out, "residual output", &io.residual},
                      {group ? &io.scale : &none, "group scales"}},
                     {{&io.x, "input"},
                      {&io.weight, "weight"},
                      {&io.residual, "residual"},
                      {group ? &none : &io.scale, "static scale"}});
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
  check_writes_apart("gather", {{&io.out, "output"}}, {{&s, "shard"}});
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

std::optional<CommPath> crossover_choice(std::span<const CrossoverEntry> table, int tp, CommTransport transport,
                                         bool norm, int64_t width, int64_t rows) {
  const auto same_key = [&](const CrossoverEntry& e) { return e.tp == tp && e.transport == transport && e.norm == norm; };
  // Nearest width by ratio (4096 and 16384 are as far from 8192; the first listed
  // keeps a tie), compared exactly: a/b < c/d as a·d < c·b.
  const auto nearer = [&](int64_t a, int64_t b) {
    return std::max(a, width) * std::min(b, width) < std::max(b, width) * std::min(a, width);
  };
  const CrossoverEntry* nearest = nullptr;
  for (const CrossoverEntry& e : table)
    if (same_key(e) && (nearest == nullptr || nearer(e.width, nearest->width))) nearest = &e;
  if (nearest == nullptr) return std::nullopt;
  std::optional<CommPath> path;
  int from = 0;
  for (const CrossoverEntry& e : table) {
    if (!same_key(e) || e.width != nearest->width) continue;
    // Why scaled: a crossover sits at a fixed payload (rows × width).
    const int64_t scaled = std::max<int64_t>(1, (static_cast<int64_t>(e.rows) * e.width + width - 1) / width);
    if (scaled <= rows && e.rows >= from) {
      path = e.path;
      from = e.rows;
    }
  }
  return path;
}

CommResult choose_all_reduce(const CommLimits& limits, CommAlgorithm algorithm, int64_t rows, int64_t width, bool norm,
                             std::span<const CrossoverEntry> table) {
  if (algorithm == CommAlgorithm::kStock) return {CommPath::kStock, "the stock path was asked for"};
  std::string one = norm ? ar_norm_refusal(limits, rows, width) : one_shot_refusal(limits, rows, width);
  std::string two = two_shot_refusal(limits, rows, width, norm);
  if (algorithm == CommAlgorithm::kOneShot)
    return one.empty() ? CommResult{CommPath::kOneShot, {}} : CommResult{CommPath::kStock, std::move(one)};
  if (algorithm == CommAlgorithm::kTwoShot)
    return two.empty() ? CommResult{CommPath::kTwoShot, {}} : CommResult{CommPath::kStock, std::move(two)};
  const CommTransport transport = limits.one_gpu ? CommTransport::kOneGpu : CommTransport::kNvlink;
  const std::optional<CommPath> named = crossover_choice(table, limits.team_size, transport, norm, width, rows);
  const char* op = norm ? "ar_norm" : "all_reduce";
  if (named == CommPath::kTwoShot && two.empty()) return {CommPath::kTwoShot, {}};
  if (named == CommPath::kStock && !limits.batch_invariant)
    return {CommPath::kStock, fmt::format("{}: {} rows of {}, where the stock path was measured fastest", op, rows, width)};
  if (one.empty()) return {CommPath::kOneShot, {}};
  if (two.empty() && limits.batch_invariant) return {CommPath::kTwoShot, {}};
  if (two.empty())
    two = fmt::format("two-shot {}: {} rows, where it was not measured faster than the stock path", op, rows);
  return {CommPath::kStock, one == two ? std::move(one) : fmt::format("{}; {}", one, two)};
}

namespace {

// The most rows a call of `path` serves at this width and op (0: not this width).
int64_t mailbox_rows(const CommLimits& l, CommPath path, int64_t width, bool norm) {
  if (path == CommPath::kTwoShot)
    return two_shot_refusal(l, 1, width, norm).empty() ? (norm ? l.two_shot_norm_rows : l.two_shot_rows) : 0;
  const bool served = norm ? ar_norm_refusal(l, 1, width).empty() : one_shot_refusal(l, 1, width).empty();
  return served ? std::min<int64_t>(l.rows_cap, norm ? l.ar_norm_rows : l.one_shot_rows) : 0;
}

CommPlan whole(int64_t rows, CommResult r) {
  const CommPath path = r.path;
  return {{{0, rows, path}}, std::move(r)};
}

// Calls of at most `chunk` rows each, their paths from `choose`; the result's why
// names the split.
template <class Choose>
CommPlan split(int64_t rows, int64_t chunk, const char* op, Choose choose) {
  CommPlan plan;
  for (int64_t first = 0; first < rows; first += chunk) {
    const int64_t n = std::min(chunk, rows - first);
    CommResult r = choose(n);
    if (first == 0) plan.result = r;
    plan.calls.push_back({first, n, r.path});
  }
  if (plan.calls.size() > 1) {
    const std::string split_why = fmt::format("batch-invariant: {}: {} rows as {} calls of at most {} rows", op, rows,
                                              plan.calls.size(), chunk);
    plan.result.why = plan.result.why.empty() ? split_why : plan.result.why + "; " + split_why;
  }
  return plan;
}

}  // namespace

CommPlan plan_all_reduce(const CommLimits& limits, CommAlgorithm algorithm, int64_t rows, int64_t width, bool norm,
                         std::span<const CrossoverEntry> table) {
  const auto choose = [&](int64_t n) { return choose_all_reduce(limits, algorithm, n, width, norm, table); };
  if (!limits.batch_invariant) return whole(rows, choose(rows));
  int64_t chunk = 0;
  if (algorithm != CommAlgorithm::kStock) {
    if (algorithm != CommAlgorithm::kTwoShot) chunk = mailbox_rows(limits, CommPath::kOneShot, width, norm);
    if (algorithm != CommAlgorithm::kOneShot) chunk = std::max(chunk, mailbox_rows(limits, CommPath::kTwoShot, width, norm));
  }
  return split(rows, chunk > 0 ? chunk : limits.rows_cap, norm ? "ar_norm" : "all_reduce", choose);
}

CommPlan plan_gather(const CommLimits& limits, CommAlgorithm algorithm, int64_t rows, int64_t shard_bytes, DType dtype) {
  const auto choose = [&](int64_t n) -> CommResult {
    if (algorithm == CommAlgorithm::kStock) return {CommPath::kStock, "the stock path was asked for"};
    std::string why = gather_refusal(limits, n, shard_bytes, dtype);
    return {why.empty() ? CommPath::kOneShot : CommPath::kStock, std::move(why)};
  };
  if (!limits.batch_invariant) return whole(rows, choose(rows));
  const bool served = algorithm != CommAlgorithm::kStock && gather_refusal(limits, 1, shard_bytes, dtype).empty();
  const int64_t chunk = served ? std::min<int64_t>(limits.rows_cap, limits.gather_rows) : 0;
  return split(rows, chunk > 0 ? chunk : limits.rows_cap, "gather", choose);
}

}  // namespace tpdecode
