// The counter-based hash behind every synthetic weight and input of the drafter:
// element (row, col) of tensor `tensor` is a pure function of (seed, tensor, row,
// col) in *global* coordinates, so each rank generates exactly its shard on the
// device and the CPU reference regenerates any element on the host.
// (No fmt here: included by .cu files.)
#pragma once

#include <cstdint>

#include "core/hash.hpp"

namespace tpdecode::drafter {

TPD_HASH_HD uint64_t element_hash(uint64_t seed, uint32_t tensor, uint64_t row, uint64_t col) {
  uint64_t h = hash::keyed(seed, tensor);
  h = hash::mix64(h ^ (row * 0xD1B54A32D192ED03ull));
  return hash::mix64(h ^ (col * 0x8CB92BA72F3D8DD7ull));
}

// Uniform in [-1, 1) with 24 bits: exact in FP32 on host and device alike.
TPD_HASH_HD float element_uniform(uint64_t seed, uint32_t tensor, uint64_t row, uint64_t col) {
  return hash::uniform24(element_hash(seed, tensor, row, col));
}

}  // namespace tpdecode::drafter
