// The rank count as a compile-time constant: a 1/2/4/8/16 switch. (No fmt here:
// this header is included by .cu files, whose front end rejects fmt's checks.)
#pragma once

#include <string>
#include <type_traits>

#include "tpdecode/error.hpp"

namespace tpdecode {

// Calls f(std::integral_constant<int, n>{}) for n in {1, 2, 4, 8, 16}.
template <class F>
decltype(auto) with_rank_count(int n, F&& f) {
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 16: return f(std::integral_constant<int, 16>{});
    default: throw InvalidArgument("team size " + std::to_string(n) + " is not supported (1, 2, 4, 8 or 16)");
  }
}

}  // namespace tpdecode
