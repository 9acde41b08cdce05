// The record a timed-out poll leaves for the host.
#pragma once

#include <cstdint>
#include <string>

namespace tpdecode {

// Which collective a poll belonged to (recorded on timeout).
enum class CommOp : int32_t {
  kNone = 0,
  kAllReduce = 1,
  kArNorm = 2,
  kGather = 3,
  kTwoShot = 4,
  kOproj = 5,
  kProtocolTest = 6,
};
const char* comm_op_name(CommOp op);

// Written once by the first thread whose poll passes its deadline (flag 0 -> 1 by
// compare-and-swap; the fields are stored before the flag is published with a
// system-scope fence). Lives in host-mapped memory, one per rank.
struct MailboxError {
  uint32_t flag;  // 0: no error; 1: fields valid
  int32_t rank;   // the rank that waited
  int32_t op;     // CommOp
  int32_t parity;
  int32_t slot;   // the peer slot that never became published
  int32_t row;
  int32_t column; // first element of the fragment
  int32_t pad;
};

std::string describe(const MailboxError& e);

// The record at `record` (host-mapped, written by a kernel), once complete: false
// when no error was recorded. A record being written (flag 2) is waited for, at
// most a few milliseconds, so its fields are never read half-written.
bool read_error(const volatile MailboxError* record, MailboxError* out);

}  // namespace tpdecode
