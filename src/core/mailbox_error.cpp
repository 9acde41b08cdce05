#include "tpdecode/mailbox_error.hpp"

#include <fmt/format.h>

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

std::string describe(const MailboxError& e) {
  return fmt::format(
      "rank {} timed out in {} (parity {}): slot {} (the peer of that rank) never published "
      "row {}, column {}; the team needs reset()",
      e.rank, comm_op_name(static_cast<CommOp>(e.op)), e.parity, e.slot, e.row, e.column);
}

}  // namespace tpdecode
