#include "tpdecode/mailbox_error.hpp"

#include <fmt/format.h>

#include <chrono>
#include <thread>

namespace tpdecode {

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::kNone: return "none";
    case CommOp::kAllReduce: return "all_reduce";
    case CommOp::kArNorm: return "ar_norm";
    case CommOp::kGather: return "gather";
    case CommOp::kTwoShot: return "two_shot";
    case CommOp::kOproj: return "oproj";
    case CommOp::kProtocolTest: return "protocol_test";
  }
  return "unknown";
}

bool read_error(const volatile MailboxError* record, MailboxError* out) {
  if (record == nullptr || record->flag == 0) return false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  while (record->flag != 1 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  out->flag = record->flag;
  out->rank = record->rank;
  out->op = record->op;
  out->parity = record->parity;
  out->slot = record->slot;
  out->row = record->row;
  out->column = record->column;
  out->pad = 0;
  return true;
}

std::string describe(const MailboxError& e) {
  return fmt::format(
      "rank {} timed out in {} (parity {}): slot {} (the peer of that rank) never published "
      "row {}, column {}; the team needs reset()",
      e.rank, comm_op_name(static_cast<CommOp>(e.op)), e.parity, e.slot, e.row, e.column);
}

}  // namespace tpdecode
