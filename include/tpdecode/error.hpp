// Error types of tpdecode. Every failure the caller can act on has its own type.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace tpdecode {

// Base of every tpdecode exception.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad argument: wrong shape, dtype, alignment, null pointer, unsupported team size.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A request above a capacity fixed at build: rows above what a buffer holds, or
// more mailboxes than a team's control block counts.
class CapacityError : public Error {
 public:
  using Error::Error;
};

// A rank's wait passed its deadline (a peer never arrived), or a call found the
// team aborted by such a rank. The message names the rank, op, parity and slot.
// Every rank must call Team::reset() before the next collective.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The team cannot go on: a rank did not arrive at a barrier in time, or the NCCL
// communicator tpdecode made for the team was aborted to end a collective that
// waited on a rank that is gone. Build a new team (a communicator you passed in is
// not affected: tpdecode only ever uses its own split of it).
class TeamBroken : public Error {
 public:
  using Error::Error;
};

// A backend or capability that this machine or build does not have.
class Unavailable : public Error {
 public:
  using Error::Error;
};

// A CUDA runtime error, with the call that failed.
class CudaError : public Error {
 public:
  CudaError(cudaError_t code, const std::string& what) : Error(what), code_(code) {}
  cudaError_t code() const { return code_; }

 private:
  cudaError_t code_;
};

[[noreturn]] void throw_cuda(cudaError_t code, const char* expr, const char* file, int line);

inline void check_cuda(cudaError_t code, const char* expr, const char* file, int line) {
  if (code != cudaSuccess) throw_cuda(code, expr, file, line);
}

// Throws InvalidArgument with `message` unless `ok`.
inline void require(bool ok, const std::string& message) {
  if (!ok) throw InvalidArgument(message);
}

}  // namespace tpdecode

#define TPD_CUDA(expr) ::tpdecode::check_cuda((expr), #expr, __FILE__, __LINE__)
