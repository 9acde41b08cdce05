// How failures reach Python: as tvm-ffi errors whose kind names the Python class
// (python/tpdecode/errors.py registers every kind below).
#pragma once

#include <string>
#include <utility>

#include "tpdecode/error.hpp"

namespace tpdecode::python {

namespace kind {
inline constexpr const char* kValue = "ValueError";  // bad shape, device, layout, alignment
inline constexpr const char* kType = "TypeError";    // bad dtype
// A well-formed call tpdecode does not take (the caller may run torch instead).
inline constexpr const char* kNotServed = "tpdecode.NotServed";
inline constexpr const char* kUnsupportedDType = "tpdecode.UnsupportedDType";
}  // namespace kind

// Throws the FFI error of `kind` (never returns).
[[noreturn]] void raise(const char* kind, const std::string& message);

// The kind a tpdecode exception maps to.
const char* kind_of(const Error& e);

// Runs f(); a tpdecode exception leaves as the FFI error of the matching kind.
template <class F>
decltype(auto) translated(F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const Error& e) {
    raise(kind_of(e), e.what());
  }
}

}  // namespace tpdecode::python
