// The host side of the error records the kernels write (protocol.hpp).
#pragma once

#include <string>

#include "comm/protocol.hpp"

namespace tpdecode {

const char* op_name(lamport::Op op);

// The record at `record` (host-mapped), once complete: false when none was
// written. A record being written (flag 2) is waited for, at most a few
// milliseconds, so its fields are never read half-written.
bool read_error_record(const volatile lamport::ErrorRecord* record, lamport::ErrorRecord* out);

// What happened, for a TimeoutError: the rank, op, parity and slot.
std::string describe_error(const lamport::ErrorRecord& e);

}  // namespace tpdecode
