#include "core/tensor_map.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "core/check.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {

CUtensorMap encode_bf16_map(const void* base, const Bf16MapShape& s, const char* what) {
  using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const EncodeTiled encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    TPD_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || fn == nullptr)
      throw Unavailable("the driver has no cuTensorMapEncodeTiled (TMA)");
    return reinterpret_cast<EncodeTiled>(fn);
  }();
  check(s.rank == 2 || s.rank == 3, "{}: a tensor map of rank {}", what, s.rank);
  cuuint64_t dims[3], strides[2];
  cuuint32_t box[3];
  const cuuint32_t element_strides[3] = {1, 1, 1};
  for (int d = 0; d < 3; ++d) {
    dims[d] = s.dims[static_cast<std::size_t>(d)];
    box[d] = s.box[static_cast<std::size_t>(d)];
  }
  for (int d = 0; d < 2; ++d) strides[d] = s.strides[static_cast<std::size_t>(d)];
  CUtensorMap map{};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, static_cast<cuuint32_t>(s.rank),
                            const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            s.swizzle, s.l2_promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw InvalidArgument(fmt::format("{}: cuTensorMapEncodeTiled refused a [{}] operand (CUresult {})", what,
                                      s.rank == 2 ? fmt::format("{}, {}", s.dims[1], s.dims[0])
                                                  : fmt::format("{}, {}, {}", s.dims[2], s.dims[1], s.dims[0]),
                                      static_cast<int>(r)));
  return map;
}

}  // namespace tpdecode
