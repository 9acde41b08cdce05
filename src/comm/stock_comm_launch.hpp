// Kernels of the stock path (stock_comm.cu); arguments are checked by the caller
// (stock_comm.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include "tpdecode/ar_norm.hpp"
#include "tpdecode/team.hpp"

namespace tpdecode {

// reduced[rows, hidden] = BF16(sum over ranks r = 0 .. size-1, in order, of the
// [rows, hidden] bf16 rows at src.base[r], row stride src_row_bytes).
void launch_stock_reduce(cudaStream_t stream, int size, const PeerPointers& src, long src_row_bytes, void* reduced,
                         int rows, int hidden);

// The separate add-RMSNorm: io.residual_out = reduced (+ io.residual), io.out =
// its RMSNorm times io.weight; io.x is not read. ArNorm's math and order exactly.
void launch_add_rms_norm(cudaStream_t stream, const void* reduced, const ArNormIo& io);

// out[row, r·S ...] = the [rows, S] rows at src.base[r] (row stride
// src_row_bytes) for r < size; S = shard_bytes (a multiple of 4).
void launch_gather_copy(cudaStream_t stream, int size, const PeerPointers& src, long src_row_bytes, void* out,
                        int rows, long shard_bytes);

}  // namespace tpdecode
