#include "tpdecode/drafter_comm.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "comm/gather_launch.hpp"
#include "tpdecode/all_reduce.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {

namespace {

// "" when t is a bf16 [rows, cols] tensor the kernels take (contiguous, rows
// 16-byte aligned), else why not.
std::string bf16_rows_refusal(const TensorView& t, int64_t rows, int64_t cols, const char* what) {
  if (t.data == nullptr) return fmt::format("{}: null", what);
  if (t.dtype != DType::kBF16) return fmt::format("{}: dtype {}, only bf16 is served", what, dtype_name(t.dtype));
  if (t.rows != rows || t.cols != cols)
    return fmt::format("{}: [{}, {}] where [{}, {}] is served", what, t.rows, t.cols, rows, cols);
  if (!t.contiguous() || !t.aligned(16)) return fmt::format("{}: not contiguous and 16-byte aligned", what);
  return {};
}

std::string rows_refusal(int64_t rows, int cap, int resident, const char* op) {
  if (rows < 1 || rows > cap) return fmt::format("{}: {} rows, served 1 ... {}", op, rows, cap);
  if (rows > resident)
    return fmt::format("{}: {} rows, the ranks on this GPU can hold {} rows' grids at once", op, rows, resident);
  return {};
}

// The first non-empty refusal.
template <class... S>
std::string first_of(S&&... reasons) {
  std::string out;
  ((out.empty() ? void(out = std::forward<S>(reasons)) : void()), ...);
  return out;
}

std::string gather_refusal(const TensorView& shard, const TensorView& out, int64_t shard_cols, int team_size,
                           int cap, int resident, const char* op) {
  if (shard.cols != shard_cols) return fmt::format("{}: shard of {} columns, served {}", op, shard.cols, shard_cols);
  if (shard_cols % 8 != 0) return fmt::format("{}: shard of {} columns is not a multiple of 8", op, shard_cols);
  return first_of(rows_refusal(shard.rows, cap, resident, op),
                  bf16_rows_refusal(shard, shard.rows, shard_cols, "shard"),
                  bf16_rows_refusal(out, shard.rows, shard_cols * team_size, "output"));
}

}  // namespace

std::string ar_norm_refusal(const DrafterCommLimits& limits, const ArNormIo& io) {
  const int64_t rows = io.x.rows;
  if (io.x.cols != limits.hidden) return fmt::format("ar_norm: hidden {}, served {}", io.x.cols, limits.hidden);
  return first_of(rows_refusal(rows, limits.rows_cap, limits.ar_norm_resident_rows, "ar_norm"),
                  bf16_rows_refusal(io.x, rows, limits.hidden, "input"),
                  io.residual.data ? bf16_rows_refusal(io.residual, rows, limits.hidden, "residual") : std::string(),
                  bf16_rows_refusal(io.weight, 1, limits.hidden, "weight"),
                  bf16_rows_refusal(io.out, rows, limits.hidden, "output"),
                  bf16_rows_refusal(io.residual_out, rows, limits.hidden, "residual output"));
}

std::string gather_context_refusal(const DrafterCommLimits& limits, const TensorView& shard, const TensorView& out) {
  return gather_refusal(shard, out, limits.hidden / limits.team_size, limits.team_size, limits.context_rows_cap,
                        limits.gather_resident_rows, "gather_context");
}

std::string gather_logits_refusal(const DrafterCommLimits& limits, const TensorView& shard, const TensorView& out) {
  if (limits.vocab_shard == 0) return "gather_logits: no vocabulary shard configured (or not a multiple of 8)";
  return gather_refusal(shard, out, limits.vocab_shard, limits.team_size, limits.rows_cap,
                        limits.gather_resident_rows, "gather_logits");
}

std::string drafter_comm_build_refusal(int team_size, const DrafterCommConfig& config) {
  if (team_size < 2) return "TP 1: nothing to communicate";
  if (!supported_team_size(team_size)) return fmt::format("team size {} is not supported", team_size);
  if (!ar_norm_hidden_supported(config.hidden))
    return fmt::format("hidden size {} is not supported (4096, 5120, 7168 or 8192)", config.hidden);
  if (config.hidden % (8 * team_size) != 0)
    return fmt::format("hidden {} does not split into TP {} shards of whole 16-byte fragments", config.hidden, team_size);
  if (config.rows_cap < 1 || config.context_rows_cap < 1 || config.vocab_shard < 0)
    return "row capacities must be positive and the vocabulary shard non-negative";
  return {};
}

std::unique_ptr<DrafterComm> DrafterComm::build(Team& team, const DrafterCommConfig& config, std::string* why_not) {
  std::string refusal = drafter_comm_build_refusal(team.size(), config);
  if (refusal.empty()) {
    try {
      return std::make_unique<DrafterComm>(team, config);
    } catch (const Unavailable& e) {  // capability fallback: the stock collectives
      refusal = e.what();
    }
  }
  if (why_not) *why_not = refusal;
  return nullptr;
}

DrafterComm::DrafterComm(Team& team, const DrafterCommConfig& config)
    : team_(team),
      ar_box_(team, all_reduce_mailbox_shape(team.size(), config.rows_cap, config.hidden)),
      context_box_(team, gather_mailbox_shape(team.size(), config.context_rows_cap, config.hidden / team.size() * 2)) {
  const int64_t vocab_shard = config.vocab_shard % 8 == 0 ? config.vocab_shard : 0;
  if (vocab_shard > 0)
    logits_box_ = std::make_unique<Mailbox>(team, gather_mailbox_shape(team.size(), config.rows_cap, vocab_shard * 2));
  const RankContext& ctx = team.rank_context(0);
  limits_.team_size = team.size();
  limits_.hidden = config.hidden;
  limits_.rows_cap = config.rows_cap;
  limits_.context_rows_cap = config.context_rows_cap;
  limits_.vocab_shard = vocab_shard;
  limits_.ar_norm_resident_rows = std::min(config.rows_cap, ar_norm_max_resident_rows(ctx, config.hidden));
  limits_.gather_resident_rows =
      std::min(std::max(config.rows_cap, config.context_rows_cap), gather_ctas_per_rank(ctx));
}

bool DrafterComm::ar_norm(int driven, const ArNormIo& io, int parity) {
  if (!ar_norm_refusal(limits_, io).empty()) return false;
  tpdecode::ar_norm(team_.rank_context(driven), ar_box_.view(driven, parity), io);
  return true;
}

bool DrafterComm::gather_context(int driven, const TensorView& shard, const TensorView& out, int parity) {
  if (!gather_context_refusal(limits_, shard, out).empty()) return false;
  gather(team_.rank_context(driven), context_box_.view(driven, parity), shard, out, GatherMode::kCopy);
  return true;
}

bool DrafterComm::gather_logits(int driven, const TensorView& shard, const TensorView& out, int parity) {
  if (!gather_logits_refusal(limits_, shard, out).empty()) return false;
  gather(team_.rank_context(driven), logits_box_->view(driven, parity), shard, out, GatherMode::kCopy);
  return true;
}

}  // namespace tpdecode
