#include "errors.hpp"

#include <tvm/ffi/error.h>

namespace tpdecode::python {

void raise(const char* kind, const std::string& message) { throw tvm::ffi::Error(kind, message, ""); }

const char* kind_of(const Error& e) {
  if (dynamic_cast<const InvalidArgument*>(&e)) return kind::kValue;
  if (dynamic_cast<const CapacityError*>(&e)) return "tpdecode.CapacityError";
  if (dynamic_cast<const TimeoutError*>(&e)) return "tpdecode.TimeoutError";
  if (dynamic_cast<const TeamBroken*>(&e)) return "tpdecode.TeamBroken";
  if (dynamic_cast<const Unavailable*>(&e)) return "tpdecode.Unavailable";
  if (dynamic_cast<const CudaError*>(&e)) return "tpdecode.CudaError";
  return "tpdecode.Error";
}

}  // namespace tpdecode::python
