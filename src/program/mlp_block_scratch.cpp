#include "program/mlp_block_scratch.hpp"

#include <cstdint>

namespace tpdecode::program {

MlpBlockScratchMemory mlp_block_scratch(const MlpBlockWidths& widths, int m) {
  const int64_t h = widths.hidden, inter = widths.intermediate;
  const int64_t cols[] = {h, h, inter, h, h};  // o, h, act, y, h2
  auto padded = [m](int64_t c) { return (m * c + 7) / 8 * 8; };
  int64_t total = 0;
  for (int64_t c : cols) total += padded(c);
  MlpBlockScratchMemory s;
  s.memory = DeviceBuffer(static_cast<std::size_t>(total) * 2);
  TensorView views[5];
  int64_t at = 0;
  for (int i = 0; i < 5; ++i) {
    views[i] = TensorView::bf16(static_cast<uint16_t*>(s.memory.get()) + at, m, cols[i]);
    at += padded(cols[i]);
  }
  s.views = {views[0], views[1], views[2], views[3], views[4]};
  return s;
}

}  // namespace tpdecode::program
