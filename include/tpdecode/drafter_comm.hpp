// DrafterComm: the drafter's TP collectives behind one object (seed 000): the
// all-reduce + residual + RMSNorm (ArNorm) and the two gathers (the column-parallel
// context projection, the vocab-parallel lm_head logits), over mailboxes built once
// at load, before any graph capture.
//
// A method returns false ("not served") for anything it does not take: dtype,
// hidden size, row count above the capacity or above what the ranks on this GPU can
// hold at once, a vocabulary shard that is not the configured one (or not a
// multiple of 8). The caller then runs the stock collective (stock_comm.hpp).
// The served rules are pure functions of DrafterCommLimits (testable without a GPU).
#pragma once

#include <memory>
#include <string>

#include "tpdecode/ar_norm.hpp"
#include "tpdecode/gather.hpp"
#include "tpdecode/mailbox.hpp"
#include "tpdecode/team.hpp"

namespace tpdecode {

struct DrafterCommConfig {
  int64_t hidden = 7168;
  int rows_cap = 64;          // ar_norm rows and logits-gather rows
  int context_rows_cap = 64;  // context-gather rows
  int64_t vocab_shard = 0;    // lm_head BF16 columns per rank; 0: no logits gather
};

// What one DrafterComm serves; fixed at build.
struct DrafterCommLimits {
  int team_size = 0;
  int64_t hidden = 0;
  int rows_cap = 0;
  int context_rows_cap = 0;
  int64_t vocab_shard = 0;        // 0: gather_logits never served
  int ar_norm_resident_rows = 0;  // rows whose ar_norm grid every rank on the GPU can hold at once
  int gather_resident_rows = 0;   // likewise for the gathers (one CTA per row at least)
};

// The served rules: "" when served, else why not.
std::string ar_norm_refusal(const DrafterCommLimits& limits, const ArNormIo& io);
std::string gather_context_refusal(const DrafterCommLimits& limits, const TensorView& shard, const TensorView& out);
std::string gather_logits_refusal(const DrafterCommLimits& limits, const TensorView& shard, const TensorView& out);
// Whether build() makes a DrafterComm for this team size and config ("" if so).
std::string drafter_comm_build_refusal(int team_size, const DrafterCommConfig& config);

class DrafterComm {
 public:
  // Collective over the team; before any capture. nullptr at TP 1, for a config it
  // cannot serve, or when the team cannot make symmetric memory (Unavailable);
  // `why_not` then says why.
  static std::unique_ptr<DrafterComm> build(Team& team, const DrafterCommConfig& config,
                                            std::string* why_not = nullptr);

  const DrafterCommLimits& limits() const { return limits_; }

  // Driven rank `driven` (see Team::rank_context). Call sites alternate parity 0/1
  // per method (e.g. by layer). Return false when not served (nothing launched).
  // Throw TimeoutError when an earlier collective of the team timed out.
  bool ar_norm(int driven, const ArNormIo& io, int parity);
  // shard: bf16 [rows, hidden / TP]; out: bf16 [rows, hidden].
  bool gather_context(int driven, const TensorView& shard, const TensorView& out, int parity);
  // shard: bf16 [rows, vocab_shard]; out: bf16 [rows, TP · vocab_shard].
  bool gather_logits(int driven, const TensorView& shard, const TensorView& out, int parity);

  DrafterComm(Team& team, const DrafterCommConfig& config);

 private:
  Team& team_;
  DrafterCommLimits limits_;
  Mailbox ar_box_;       // [2, TP, rows_cap, hidden] bf16
  Mailbox context_box_;  // [2, 1, context_rows_cap, hidden] bf16
  std::unique_ptr<Mailbox> logits_box_;  // [2, 1, rows_cap, TP · vocab_shard] bf16, if configured
};

}  // namespace tpdecode
