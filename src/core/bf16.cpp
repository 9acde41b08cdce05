#include "core/bf16.hpp"

#include <cstdlib>

namespace tpdecode::bf16 {

int ulp_distance(Bits a, Bits b) {
  // Map sign-magnitude to a monotonic integer line (+0 and -0 both at 0).
  auto line = [](Bits x) { return (x & 0x8000u) ? -static_cast<int>(x & 0x7fffu) : static_cast<int>(x); };
  return std::abs(line(a) - line(b));
}

void reduce_rank_order(std::span<const Bits* const> partials, std::span<Bits> out) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    float acc = to_float(partials[0][i]);
    for (std::size_t r = 1; r < partials.size(); ++r) acc += to_float(partials[r][i]);
    out[i] = from_float(acc);
  }
}

}  // namespace tpdecode::bf16
