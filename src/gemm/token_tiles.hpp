// Calls f(std::integral_constant<int, T>) for the warp engine's token tiles T = 1,
// 2, 4, 8 (8, 16, 32, 64 rows): its kernels (and the o-projection's) are
// instantiated per T.
#pragma once

#include <type_traits>

#include "tpdecode/error.hpp"

namespace tpdecode {

template <class F>
decltype(auto) with_token_tiles(int tiles, F&& f) {
  switch (tiles) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: throw InvalidArgument("warp engine: token tiles must be 1, 2, 4 or 8");
  }
}

}  // namespace tpdecode
