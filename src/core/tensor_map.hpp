// Tensor maps (TMA descriptors) of BF16 operands, encoded by the driver's
// cuTensorMapEncodeTiled (looked up at run time: the library links the runtime only).
#pragma once

#include <cuda.h>

#include <array>
#include <cstdint>

namespace tpdecode {

struct Bf16MapShape {
  int rank = 2;                          // 2 or 3
  std::array<uint64_t, 3> dims{};        // elements, innermost first
  std::array<uint64_t, 2> strides{};     // bytes of dimensions 1 and 2 (multiples of 16)
  std::array<uint32_t, 3> box{};         // elements per dimension of one copy
  CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_NONE;
  CUtensorMapL2promotion l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
};

// Elements outside `dims` arrive as zeros. Throws Unavailable where the driver has no
// encoder, InvalidArgument (naming `what` and the dimensions) where it refuses one.
CUtensorMap encode_bf16_map(const void* base, const Bf16MapShape& s, const char* what);

}  // namespace tpdecode
