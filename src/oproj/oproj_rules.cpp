#include "oproj/oproj_rules.hpp"

#include <fmt/format.h>

#include <vector>

#include "comm/kernels.hpp"
#include "comm/rules.hpp"
#include "core/check.hpp"
#include "core/tensor_overlap.hpp"
#include "gemm/gemm_tactic.hpp"
#include "oproj/oproj_kernels.hpp"

namespace tpdecode {

const char* oproj_epilogue_name(OprojEpilogue e) { return e == OprojEpilogue::kArNorm ? "ar_norm" : "attn_res"; }

const char* oproj_kind_name(OprojKind k) {
  switch (k) {
    case OprojKind::kUnfused: return "unfused";
    case OprojKind::kProducerConsumer: return "producer-consumer";
    case OprojKind::kFused: return "fused";
    case OprojKind::kTwoShot: return "two-shot";
  }
  return "?";
}

std::span<const OprojRule> oproj_rule_table() {
  // Empty: every mailbox kind measured slower than the unfused path (NCCL TP 2 with
  // ArNorm 1.37-1.67 x at M 1-8, with AttnRes 1.8-2.1 x; local TP 8 producer-consumer
  // 1.51 x at M 1: docs/oproj.md, docs/performance.md), so every call runs unfused
  // unless a kind is forced. A row needs a `tpdecode bench oproj` run measuring its
  // kind at least kOprojRuleGain faster than unfused.
  static const std::vector<OprojRule> table = {};
  return table;
}

int oproj_fused_grid_ctas(int64_t hidden, int split, int m) {
  return static_cast<int>(hidden / kWarpCtaRows) * split + kArNormCtas * m;
}

namespace {

// bf16, non-null, contiguous, 16-byte aligned, [rows, cols].
void check_bf16(const TensorView& t, int64_t rows, int64_t cols, const char* what) {
  check(t.data != nullptr, "oproj: {} is null", what);
  check(t.dtype == DType::kBF16, "oproj: {} has dtype {}, bf16 is required", what, dtype_name(t.dtype));
  check(t.rows == rows && t.cols == cols, "oproj: {} is [{}, {}], [{}, {}] is required", what, t.rows, t.cols, rows,
        cols);
  check(t.contiguous() && t.aligned(16), "oproj: {} must be contiguous and 16-byte aligned ({})", what, t.describe());
}

void check_f32(const TensorView& t, int64_t rows, int64_t cols, std::size_t align, const char* what) {
  check(t.data != nullptr && t.dtype == DType::kF32, "oproj: {} must be a non-null f32 tensor", what);
  check(t.rows == rows && t.cols == cols, "oproj: {} is [{}, {}], [{}, {}] is required", what, t.rows, t.cols, rows,
        cols);
  check(t.contiguous() && t.aligned(align), "oproj: {} must be contiguous and {}-byte aligned ({})", what, align,
        t.describe());
}

int64_t checked_rows(const TensorView& x, int64_t k) {
  check(x.rows >= 1 && x.rows <= kOprojMaxRows, "oproj: {} rows (1 .. {})", x.rows, kOprojMaxRows);
  check_bf16(x, x.rows, k, "x");
  return x.rows;
}

std::string mailbox_refusal(const OprojLimits& l, int m) {
  if (l.team_size < 2) return "TP 1: nothing to reduce";
  if (!l.shares_memory) return "the ranks do not share memory (not one NVLink domain): NCCL reduces";
  if (!ar_norm_hidden_served(l.hidden))
    return fmt::format("hidden {}: the row epilogues take multiples of 64 up to {}", l.hidden, kArNormMaxHidden);
  if (!warp_eligible(l.hidden, l.k))
    return fmt::format("the warp split-K engine does not take the weight {} x {}", l.hidden, l.k);
  if (m > l.rows_cap) return fmt::format("{} rows, the mailbox holds {}", m, l.rows_cap);
  return {};
}

}  // namespace

void check_oproj_io(const OprojArNormIo& io, int64_t hidden, int64_t k) {
  const int64_t m = checked_rows(io.x, k);
  check_norm_eps(io.eps, "oproj");
  if (io.residual.data) check_bf16(io.residual, m, hidden, "residual");
  check_bf16(io.weight, 1, hidden, "norm weight");
  check_bf16(io.out, m, hidden, "output");
  check_bf16(io.residual_out, m, hidden, "residual output");
  // The new residual may be the residual itself (in place).
  check_writes_apart("oproj", {{&io.out, "output"}, {&io.residual_out, "residual output", &io.residual}},
                     {{&io.x, "x"}, {&io.weight, "norm weight"}, {&io.residual, "residual"}});
}

void check_oproj_io(const OprojAttnResIo& io, int64_t hidden, int64_t k) {
  const int64_t m = checked_rows(io.x, k);
  check_norm_eps(io.eps, "oproj");
  if (!io.new_block) check_bf16(io.partial, m, hidden, "partial");
  check_bf16(io.partial_out, m, hidden, "partial output");
  check(io.blocks.rows >= 0 && io.blocks.rows % m == 0, "oproj: saved blocks of {} rows for calls of {} rows",
        io.blocks.rows, m);
  const int64_t nb = io.blocks.rows / m;
  check(nb <= kAttnResMaxBlocks, "oproj: {} saved blocks, the AttnRes epilogue takes at most {}", nb,
        kAttnResMaxBlocks);
  if (nb > 0) check_bf16(io.blocks, nb * m, hidden, "saved blocks");
  check_bf16(io.key_norm, 1, hidden, "key norm weight");
  check_bf16(io.query, 1, hidden, "pseudo-query");
  check_bf16(io.out_norm, 1, hidden, "output norm weight");
  check_bf16(io.out, m, hidden, "output");
  if (io.ahead) {
    check(nb >= 1, "oproj: bind_ahead needs saved blocks (there are none)");
    check_norm_eps(io.ahead->eps, "oproj ahead");
    check_bf16(io.ahead->key_norm, 1, hidden, "next key norm weight");
    check_bf16(io.ahead->query, 1, hidden, "next pseudo-query");
    check_f32(io.ahead->stats, m, 2, 8, "ahead statistics");
    check_f32(io.ahead->mixture, m, hidden, 16, "ahead mixture");
  }
  // p' may be p (in place); a new block reads no partial.
  const TensorView none{};
  const AttnResAhead* ahead = io.ahead ? &*io.ahead : nullptr;
  check_writes_apart("oproj",
                     {{&io.out, "output"},
                      {&io.partial_out, "partial output", &io.partial},
                      {ahead ? &ahead->stats : &none, "ahead statistics"},
                      {ahead ? &ahead->mixture : &none, "ahead mixture"}},
                     {{&io.x, "x"},
                      {io.new_block ? &none : &io.partial, "partial"},
                      {&io.blocks, "saved blocks"},
                      {&io.key_norm, "key norm weight"},
                      {&io.query, "pseudo-query"},
                      {&io.out_norm, "output norm weight"},
                      {ahead ? &ahead->key_norm : &none, "next key norm weight"},
                      {ahead ? &ahead->query : &none, "next pseudo-query"}});
}

std::string oproj_refusal(const OprojLimits& l, const OprojShape& s, OprojKind kind) {
  const int m = s.m;
  switch (kind) {
    case OprojKind::kUnfused: return {};
    case OprojKind::kTwoShot: {
      if (std::string why = mailbox_refusal(l, m); !why.empty()) return why;
      if (l.hidden % (8 * l.team_size) != 0)
        return fmt::format("two-shot: hidden {} does not split into whole fragments over {} owners", l.hidden,
                           l.team_size);
      if (l.two_shot_clusters < 1)
        return "two-shot: no two-shot mailbox of this width, or not one consumer cluster per rank resident";
      return {};
    }
    case OprojKind::kProducerConsumer: {
      if (std::string why = mailbox_refusal(l, m); !why.empty()) return why;
      if (m > l.consumer_rows)
        return fmt::format("producer-consumer: {} rows, the ranks on this GPU can hold {} rows' consumer grids at once",
                           m, l.consumer_rows);
      return {};
    }
    case OprojKind::kFused: {
      if (std::string why = mailbox_refusal(l, m); !why.empty()) return why;
      if (ar_norm_threads(l.hidden) > kWarpWarps * 32)
        return fmt::format("fused: hidden {}, its CTAs of {} threads hold rows up to 8192", l.hidden,
                           kWarpWarps * 32);
      if (m > 8 * kOprojFusedMaxTiles)
        return fmt::format("fused: {} rows, it takes at most {}", m, 8 * kOprojFusedMaxTiles);
      if (kArNormCtas % s.split != 0)
        return fmt::format("fused: split {} does not divide its clusters of {}", s.split, kArNormCtas);
      if ((l.hidden / kWarpCtaRows) * s.split % kArNormCtas != 0)
        return fmt::format("fused: the GEMM's {} x split {} CTAs do not fill clusters of {}", l.hidden / kWarpCtaRows,
                           s.split, kArNormCtas);
      if (s.fused_ctas > s.fused_budget)
        return fmt::format("fused: {} CTAs per rank, the ranks on this GPU can hold {} at once", s.fused_ctas,
                           s.fused_budget);
      return {};
    }
  }
  return "unknown kind";
}

OprojResult choose_oproj(const OprojLimits& l, const OprojShape& s, std::optional<OprojKind> forced,
                         std::span<const OprojRule> table) {
  std::optional<OprojKind> want = forced;
  if (!want) {
    for (const OprojRule& r : table)
      if (r.team == l.team && r.team_size == l.team_size && r.hidden == l.hidden && r.k == l.k &&
          r.epilogue == l.epilogue && s.m >= r.m_min && s.m <= r.m_max) {
        want = r.kind;
        break;
      }
    if (!want) return {OprojKind::kUnfused, "no measured rule for this team, shape and row count"};
  }
  std::string why = oproj_refusal(l, s, *want);
  if (why.empty()) return {*want, {}};
  return {OprojKind::kUnfused, std::move(why)};
}

}  // namespace tpdecode
