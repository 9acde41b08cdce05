// Launcher of the logits epilogue (logits_epilogue.cu): slice to the real
// vocabulary, optional soft cap, scale. Arguments are checked by draft_logits.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tpdecode {

inline constexpr int64_t kLogitsMaxRows = 65535;  // one row per grid y index

struct LogitsEpilogueParams {
  const void* in;     // [rows, in_stride] bf16 (the gathered logits)
  void* out;          // [rows, out_stride] bf16
  int64_t rows;
  int64_t vocab;      // columns written
  int64_t in_stride;  // elements
  int64_t out_stride;
  float soft_cap;     // 0: none
  float scale;
};

void launch_logits_epilogue(const LogitsEpilogueParams& p, cudaStream_t stream);

}  // namespace tpdecode
