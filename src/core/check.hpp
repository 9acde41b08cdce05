// Argument checks that format their message only when they fail: a passing check
// costs a comparison (host code only; nvcc's front end rejects fmt's compile-time
// format checks, so .cu files call checks in their .cpp).
#pragma once

#include <fmt/format.h>

#include <utility>

#include "tpdecode/error.hpp"

namespace tpdecode {

template <class E = InvalidArgument, class... Args>
inline void check(bool ok, fmt::format_string<Args...> message, Args&&... args) {
  if (!ok) [[unlikely]]
    throw E(fmt::format(message, std::forward<Args>(args)...));
}

}  // namespace tpdecode
