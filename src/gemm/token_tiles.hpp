// Calls f(std::integral_constant<int, T>) for the engines' token tiles T = 1, 2, 4
// (8, 16, 32 rows): the kernels are instantiated per T.
#pragma once

#include <type_traits>

#include "tpdecode/error.hpp"

namespace tpdecode {

template <class F>
void with_token_tiles(int tiles, F&& f) {
  switch (tiles) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    default: throw InvalidArgument("decode gemm engines: token tiles must be 1, 2 or 4");
  }
}

}  // namespace tpdecode
