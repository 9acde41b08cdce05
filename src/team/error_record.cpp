#include "team/error_record.hpp"

#include <fmt/format.h>

#include <chrono>
#include <thread>

namespace tpdecode {

const char* op_name(lamport::Op op) {
  switch (op) {
    case lamport::Op::kNone: return "none";
    case lamport::Op::kAllReduce: return "all_reduce";
    case lamport::Op::kArNorm: return "ar_norm";
    case lamport::Op::kGather: return "gather";
    case lamport::Op::kTwoShotReduce: return "two_shot (owner's reduce)";
    case lamport::Op::kTwoShotGather: return "two_shot (gather)";
    case lamport::Op::kOproj: return "oproj";
    case lamport::Op::kTest: return "protocol_test";
    case lamport::Op::kProgram: return "team program (all-reduce + norm)";
  }
  return "unknown";
}

bool read_error_record(const volatile lamport::ErrorRecord* record, lamport::ErrorRecord* out) {
  if (record == nullptr || record->flag == 0) return false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  while (record->flag != 1 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  out->flag = record->flag;
  out->kind = record->kind;
  out->rank = record->rank;
  out->op = record->op;
  out->parity = record->parity;
  out->slot = record->slot;
  out->row = record->row;
  out->column = record->column;
  return true;
}

std::string describe_error(const lamport::ErrorRecord& e) {
  const char* op = op_name(static_cast<lamport::Op>(e.op));
  if (static_cast<lamport::ErrorKind>(e.kind) == lamport::ErrorKind::kAborted)
    return fmt::format(
        "rank {}: {} did not run: rank {} timed out and aborted the team (its outputs hold NaN); every rank must "
        "call reset()",
        e.rank, op, e.slot);
  return fmt::format(
      "rank {} timed out in {} (parity {}): slot {} (written by rank {}) never published row {}, column {}; the "
      "team is aborted until every rank calls reset()",
      e.rank, op, e.parity, e.slot, e.slot, e.row, e.column);
}

}  // namespace tpdecode
