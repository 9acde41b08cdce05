// The one-tile narrow CTA's tensor-map form: its ldmatrix rows and x copies
// (gemm/narrow_tma_layout.hpp) against a model of one stage in shared memory. The
// weight lands as the tensor map's 128-byte swizzle places it (the hardware's rule,
// written here from the address: 16-byte piece bits 4-6 XOR address bits 7-9); x as
// the lanes' copies place it; ldmatrix.x4 and mma.sync m16n8k16's fragments as the
// PTX manual defines them.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "gemm/narrow_tma_layout.hpp"

namespace tpdecode {
namespace {

using narrow_tma::a_offset;
using narrow_tma::b_offset;
using narrow_tma::x_offset;

constexpr int kRows = 16, kCols = 128;

uint16_t w_value(int row, int col) { return static_cast<uint16_t>(1 + row * kCols + col); }
uint16_t x_value(int token, int col) { return static_cast<uint16_t>(10000 + token * kCols + col); }

// One stage: W (4 KB, the box) then x ([tokens][128]), as bf16 words.
struct Stage {
  int tokens;
  std::vector<uint16_t> w = std::vector<uint16_t>(kRows * kCols, 0);
  std::vector<uint16_t> x;
  std::vector<int> x_writes;  // per x element: how many copies wrote it

  explicit Stage(int t) : tokens(t), x(t * kCols, 0), x_writes(t * kCols, 0) {
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < kCols; ++c) {
        const int plain = (c / 64) * narrow_tma::kHalfBytes + r * 128 + (c % 64) * 2;  // the box, unswizzled
        const int swizzled = plain ^ (((plain >> 7) & 7) << 4);
        w[swizzled / 2] = w_value(r, c);
      }
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < tokens / 2; ++i) {
        const int token = lane / 16 + 2 * i;
        for (int e = 0; e < 8; ++e) {
          const int at = x_offset(lane, i) / 2 + e;
          x[at] = x_value(token, 8 * (lane % 16) + e);
          ++x_writes[at];
        }
      }
  }
  // ldmatrix.x4 from the region `mem` (bytes at each lane's address): register j of
  // `lane` holds row lane / 4 of matrix j (whose row i lane 8 j + i addresses),
  // elements 2 (lane % 4) and + 1, the lower address in the low half.
  static uint32_t ldmatrix(const std::vector<uint16_t>& mem, const int (&address)[32], int lane, int j) {
    const int at = address[8 * j + lane / 4] / 2 + 2 * (lane % 4);
    return mem[at] | (uint32_t{mem[at + 1]} << 16);
  }
};

uint32_t pair(uint16_t lo, uint16_t hi) { return lo | (uint32_t{hi} << 16); }

TEST(NarrowTmaLayout, EveryXElementIsCopiedOnce) {
  for (int tokens : {8, 16}) {
    const Stage s(tokens);
    for (int e = 0; e < tokens * kCols; ++e) ASSERT_EQ(s.x_writes[e], 1) << tokens << " tokens, element " << e;
  }
  // The kernel's x addresses: four per lane, then 512 bytes (two tokens) a copy.
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 8; ++i) EXPECT_EQ(x_offset(lane, i), x_offset(lane, i % 4) - 512 * (i % 4) + 512 * i) << lane;
}

// The A registers of k16 step s are mma.m16n8k16's: a0 (row g, k 2t, 2t+1), a1 (row
// g + 8), a2 (row g, k 2t + 8, + 9), a3 (row g + 8, k 2t + 8, + 9); g = lane / 4, t =
// lane % 4, k counted from column 16 s of the chunk.
TEST(NarrowTmaLayout, WeightFragmentsAreTheMmasA) {
  const Stage s(8);
  for (int step = 0; step < 8; ++step) {
    int address[32];
    for (int lane = 0; lane < 32; ++lane) address[lane] = a_offset(lane, step);
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, k = 16 * step + 2 * (lane % 4);
      EXPECT_EQ(Stage::ldmatrix(s.w, address, lane, 0), pair(w_value(g, k), w_value(g, k + 1))) << step << " " << lane;
      EXPECT_EQ(Stage::ldmatrix(s.w, address, lane, 1), pair(w_value(g + 8, k), w_value(g + 8, k + 1)));
      EXPECT_EQ(Stage::ldmatrix(s.w, address, lane, 2), pair(w_value(g, k + 8), w_value(g, k + 9)));
      EXPECT_EQ(Stage::ldmatrix(s.w, address, lane, 3), pair(w_value(g + 8, k + 8), w_value(g + 8, k + 9)));
    }
  }
}

// The B registers of steps 2 q and 2 q + 1 for token tile j: (b0, b1) of a step are
// token g's k 2t, 2t+1 and 2t + 8, + 9.
TEST(NarrowTmaLayout, ActivationFragmentsAreTheMmasB) {
  for (int tokens : {8, 16}) {
    const Stage s(tokens);
    for (int tile = 0; tile < tokens / 8; ++tile)
      for (int q = 0; q < 4; ++q) {
        int address[32];
        for (int lane = 0; lane < 32; ++lane) address[lane] = tile * 8 * narrow_tma::kXRowBytes + b_offset(lane, q);
        for (int lane = 0; lane < 32; ++lane) {
          const int token = 8 * tile + lane / 4;
          for (int h = 0; h < 2; ++h) {
            const int k = 16 * (2 * q + h) + 2 * (lane % 4);
            EXPECT_EQ(Stage::ldmatrix(s.x, address, lane, 2 * h), pair(x_value(token, k), x_value(token, k + 1)))
                << tokens << " tokens, q " << q << " lane " << lane;
            EXPECT_EQ(Stage::ldmatrix(s.x, address, lane, 2 * h + 1),
                      pair(x_value(token, k + 8), x_value(token, k + 9)));
          }
        }
      }
  }
}

// Each of an ldmatrix's four 8-row phases reads 8 different 16-byte bank groups (no
// conflict); the x copies of one instruction (32 lanes, 512 bytes) too.
TEST(NarrowTmaLayout, NoBankConflicts) {
  auto distinct_groups = [](const std::vector<int>& addresses) {
    std::set<int> groups;
    for (int a : addresses) groups.insert((a / 16) % 8);
    return groups.size() == addresses.size();
  };
  for (int lane0 = 0; lane0 < 32; lane0 += 8) {
    for (int step = 0; step < 8; ++step) {
      std::vector<int> a;
      for (int i = 0; i < 8; ++i) a.push_back(a_offset(lane0 + i, step));
      EXPECT_TRUE(distinct_groups(a)) << "A, step " << step << ", lanes " << lane0 << "..";
    }
    for (int q = 0; q < 4; ++q) {
      std::vector<int> b;
      for (int i = 0; i < 8; ++i) b.push_back(b_offset(lane0 + i, q));
      EXPECT_TRUE(distinct_groups(b)) << "B, q " << q << ", lanes " << lane0 << "..";
    }
  }
  for (int i = 0; i < 8; ++i)
    for (int lane0 = 0; lane0 < 32; lane0 += 8) {
      std::vector<int> x;
      for (int l = 0; l < 8; ++l) x.push_back(x_offset(lane0 + l, i));
      EXPECT_TRUE(distinct_groups(x)) << "x copy " << i << ", lanes " << lane0 << "..";
    }
}

}  // namespace
}  // namespace tpdecode
