// Where the one-tile narrow CTA's tensor-map form (narrow_tma_loop.cuh) finds its
// operands in a stage: the byte offsets of its ldmatrix rows and its x copies, apart
// from the kernel so that the CPU tests check them against mma.sync's fragments and
// the banks (tests/cpu/narrow_tma_layout_test.cpp).
//
// A stage's W is one box [2 halves][16 rows][64 columns] with the 128-byte swizzle:
// row r of half h at h * 2048 + 128 r, its 16-byte piece p at ((p ^ (r % 8)) * 16) of
// that row (the stage 1024-byte aligned). A stage's x is [tokens][128 columns], token
// t's piece p at 256 t + ((p ^ (t % 8)) * 16).
#pragma once

#if defined(__CUDACC__)
#define TPD_LAYOUT_HD __host__ __device__ __forceinline__
#else
#define TPD_LAYOUT_HD inline
#endif

namespace tpdecode::narrow_tma {

inline constexpr int kHalfBytes = 2048;  // one [16, 64] bf16 half of a stage's W
inline constexpr int kXRowBytes = 256;   // one token's 128 columns

// The address lane `lane` gives ldmatrix.x4 for the A fragment of k16 step `step`
// (0..7) of a chunk: matrix j = lane / 8 is rows 8 (j % 2) .., columns 16 step + 8 (j
// / 2) ..: registers a0..a3 of mma.m16n8k16 (rows g / g + 8, k 2t / 2t + 8).
TPD_LAYOUT_HD int a_offset(int lane, int step) {
  const int row = lane % 16;
  const int piece = 2 * (step % 4) + lane / 16;
  return (step / 4) * kHalfBytes + row * 128 + 16 * (piece ^ (row % 8));
}

// The address lane `lane` gives ldmatrix.x4 for the B fragments of k16 steps 2 q and
// 2 q + 1 of token tile 0 (tile j: + 8 j * kXRowBytes): matrix j = lane / 8 is
// tokens 0..7, columns 8 (4 q + j) ..: registers (b0, b1) of step 2 q, then of 2 q + 1.
TPD_LAYOUT_HD int b_offset(int lane, int q) {
  const int token = lane % 8;
  return token * kXRowBytes + 16 * ((4 * q + lane / 8) ^ token);
}

// Where x copy i of lane `lane` lands: lane copies piece lane % 16 (columns 8 (lane %
// 16) ..) of token lane / 16 + 2 i.
TPD_LAYOUT_HD int x_offset(int lane, int i) {
  const int token = lane / 16 + 2 * i;
  return token * kXRowBytes + 16 * ((lane % 16) ^ (token % 8));
}

}  // namespace tpdecode::narrow_tma
