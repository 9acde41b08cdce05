// An MLP block's intermediates (mlp_block_ops.hpp's MlpBlockScratch: o, h, act, y,
// h2) in one device allocation of their owner's.
#pragma once

#include "program/mlp_block_ops.hpp"
#include "tpdecode/device_buffer.hpp"

namespace tpdecode::program {

struct MlpBlockScratchMemory {
  DeviceBuffer memory;
  MlpBlockScratch views;  // into memory, each [m, cols] from a 16-byte boundary
};

MlpBlockScratchMemory mlp_block_scratch(const MlpBlockWidths& widths, int m);

}  // namespace tpdecode::program
