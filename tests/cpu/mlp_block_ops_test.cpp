// The ops an MlpBlockProgram runs: which op reads which, where the residual stream
// goes, which norms fold (the post norm behind o_proj, the next norm before qkv and
// only behind a folded post norm), the refusals of shapes that do not chain or
// buffers that overlap, and what the launch form serves.
#include <gtest/gtest.h>

#include <limits>

#include <cstdint>

#include "program/mlp_block_launches.hpp"
#include "program/mlp_block_ops.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/team_mlp_block.hpp"

namespace tpdecode::program {
namespace {

constexpr int kM = 4;
constexpr int64_t kH = 512, kI = 768, kA = 256, kQ = 640;

// Distinct fake addresses: nothing here dereferences them.
TensorView at(int index, int64_t rows, int64_t cols) {
  return TensorView::bf16(reinterpret_cast<void*>(uintptr_t{0x100000} * static_cast<uintptr_t>(index + 1)), rows,
                          cols);
}

struct Block {
  MlpBlockProgram::Weights w{at(0, kH, kA), at(1, 1, kH), at(2, 2 * kI, kH), at(3, kH, kI), at(4, 1, kH),
                             at(5, kQ, kH), 1e-5f};
  MlpBlockProgram::Buffers b{at(6, kM, kA), at(7, kM, kH), at(8, kM, kQ)};
  MlpBlockScratch s{at(9, kM, kH), at(10, kM, kH), at(11, kM, kI), at(12, kM, kH), at(13, kM, kH)};
};

bool same(const TensorView& a, const TensorView& b) {
  return a.data == b.data && a.rows == b.rows && a.cols == b.cols && a.row_stride == b.row_stride;
}

TEST(MlpBlockOps, TheWholeBlockFoldsBothNorms) {
  const Block k;
  EXPECT_EQ(check_mlp_block(k.w, k.b, kM).hidden, kH);
  EXPECT_EQ(check_mlp_block(k.w, k.b, kM).intermediate, kI);
  const MlpBlockOps r = mlp_block_ops(k.w, k.b, k.s, MlpBlockNorms::kFold);
  ASSERT_EQ(r.ops.size(), 6u);
  EXPECT_EQ(r.post_norm, 1);
  EXPECT_EQ(r.next_norm, 4);
  const auto& o = r.ops;
  EXPECT_FALSE(o[0].is_norm);
  EXPECT_TRUE(same(o[0].gemm.weight, k.w.o_proj) && same(o[0].gemm.x, k.b.attn) && same(o[0].gemm.out, k.s.o));
  EXPECT_EQ(o[0].gemm.after, -1);
  ASSERT_TRUE(o[1].is_norm);
  EXPECT_TRUE(o[1].norm.folded);
  EXPECT_EQ(o[1].norm.after, 0);
  EXPECT_TRUE(same(o[1].norm.x, k.s.o) && same(o[1].norm.out, k.s.h));
  EXPECT_TRUE(same(o[1].norm.residual, k.b.residual) && same(o[1].norm.residual_out, k.b.residual));
  EXPECT_EQ(o[1].norm.eps, 1e-5f);
  EXPECT_EQ(o[2].gemm.epilogue, GemmProgram::Epilogue::kSiluMul);
  EXPECT_EQ(o[2].gemm.after, 1);
  EXPECT_TRUE(same(o[2].gemm.x, k.s.h) && same(o[2].gemm.out, k.s.act) && same(o[2].gemm.weight, k.w.gate_up));
  EXPECT_EQ(o[3].gemm.epilogue, GemmProgram::Epilogue::kPlain);
  EXPECT_EQ(o[3].gemm.after, 2);
  EXPECT_TRUE(same(o[3].gemm.x, k.s.act) && same(o[3].gemm.out, k.s.y) && same(o[3].gemm.weight, k.w.down));
  ASSERT_TRUE(o[4].is_norm);
  EXPECT_TRUE(o[4].norm.folded);
  EXPECT_EQ(o[4].norm.after, 3);
  EXPECT_TRUE(same(o[4].norm.x, k.s.y) && same(o[4].norm.out, k.s.h2) && same(o[4].norm.weight, k.w.next_norm));
  EXPECT_TRUE(same(o[4].norm.residual, k.b.residual) && same(o[4].norm.residual_out, k.b.residual));
  EXPECT_EQ(o[5].gemm.after, 4);
  EXPECT_TRUE(same(o[5].gemm.x, k.s.h2) && same(o[5].gemm.out, k.b.out) && same(o[5].gemm.weight, k.w.qkv));
}

TEST(MlpBlockOps, FoldOffKeepsNormOps) {
  const Block k;
  const MlpBlockOps r = mlp_block_ops(k.w, k.b, k.s, MlpBlockNorms::kNormOps);
  ASSERT_EQ(r.ops.size(), 6u);
  EXPECT_FALSE(r.ops[1].norm.folded);
  EXPECT_FALSE(r.ops[4].norm.folded);
}

// At TP > 1 (TeamMlpBlock) both norms all-reduce their x, o (or attn) and y, and
// neither folds; every other field is the unfolded block's.
TEST(MlpBlockOps, AllReducingNormsTakeThePartialsAndNeverFold) {
  for (bool o_proj : {true, false}) {
    SCOPED_TRACE(o_proj ? "o_proj" : "no o_proj");
    Block k;
    if (!o_proj) {
      k.w.o_proj = {};
      k.b.attn = at(6, kM, kH);
    }
    const MlpBlockOps unfolded = mlp_block_ops(k.w, k.b, k.s, MlpBlockNorms::kNormOps);
    const MlpBlockOps r = mlp_block_ops(k.w, k.b, k.s, MlpBlockNorms::kAllReduce);
    ASSERT_EQ(r.ops.size(), unfolded.ops.size());
    EXPECT_EQ(r.post_norm, unfolded.post_norm);
    EXPECT_EQ(r.next_norm, unfolded.next_norm);
    for (std::size_t i = 0; i < r.ops.size(); ++i) {
      const GemmProgram::Op &a = r.ops[i], &b = unfolded.ops[i];
      ASSERT_EQ(a.is_norm, b.is_norm) << "op " << i;
      if (!a.is_norm) {
        EXPECT_TRUE(same(a.gemm.weight, b.gemm.weight) && same(a.gemm.x, b.gemm.x) && same(a.gemm.out, b.gemm.out));
        EXPECT_EQ(a.gemm.after, b.gemm.after);
        continue;
      }
      EXPECT_TRUE(a.norm.all_reduce) << "op " << i;
      EXPECT_FALSE(b.norm.all_reduce) << "op " << i;
      EXPECT_FALSE(a.norm.folded) << "op " << i;
      EXPECT_TRUE(same(a.norm.x, b.norm.x) && same(a.norm.out, b.norm.out) && same(a.norm.weight, b.norm.weight));
      EXPECT_TRUE(same(a.norm.residual, k.b.residual) && same(a.norm.residual_out, k.b.residual));
      EXPECT_EQ(a.norm.after, b.norm.after);
    }
    EXPECT_TRUE(same(r.ops[static_cast<std::size_t>(r.post_norm)].norm.x, o_proj ? k.s.o : k.b.attn))
        << "the post norm reduces o_proj's partial, or the caller's";
    EXPECT_TRUE(same(r.ops[static_cast<std::size_t>(r.next_norm)].norm.x, k.s.y)) << "the next norm reduces down's";
  }
}

TEST(MlpBlockOps, WithoutOprojThePostNormReadsTheInputAndNeitherFolds) {
  Block k;
  k.w.o_proj = {};
  k.b.attn = at(6, kM, kH);
  ASSERT_NO_THROW(check_mlp_block(k.w, k.b, kM));
  const MlpBlockOps r = mlp_block_ops(k.w, k.b, k.s, MlpBlockNorms::kFold);
  ASSERT_EQ(r.ops.size(), 5u);
  EXPECT_EQ(r.post_norm, 0);
  EXPECT_EQ(r.ops[0].norm.after, -1);
  EXPECT_TRUE(same(r.ops[0].norm.x, k.b.attn));
  EXPECT_FALSE(r.ops[0].norm.folded) << "x is an input, not a GEMM's out";
  EXPECT_EQ(r.next_norm, 3);
  EXPECT_FALSE(r.ops[3].norm.folded) << "its residual stream comes from an unfolded norm";
}

TEST(MlpBlockOps, WithoutQkvTheNextNormWritesOutUnfolded) {
  Block k;
  k.w.qkv = {};
  k.b.out = at(8, kM, kH);
  ASSERT_NO_THROW(check_mlp_block(k.w, k.b, kM));
  const MlpBlockOps r = mlp_block_ops(k.w, k.b, k.s, MlpBlockNorms::kFold);
  ASSERT_EQ(r.ops.size(), 5u);
  EXPECT_TRUE(r.ops[1].norm.folded);
  EXPECT_FALSE(r.ops[4].norm.folded) << "the caller reads its out";
  EXPECT_TRUE(same(r.ops[4].norm.out, k.b.out));
}

TEST(MlpBlockOps, WithoutNextNormDownWritesOut) {
  Block k;
  k.w.qkv = k.w.next_norm = {};
  k.b.out = at(8, kM, kH);
  ASSERT_NO_THROW(check_mlp_block(k.w, k.b, kM));
  const MlpBlockOps r = mlp_block_ops(k.w, k.b, k.s, MlpBlockNorms::kFold);
  ASSERT_EQ(r.ops.size(), 4u);
  EXPECT_EQ(r.next_norm, -1);
  EXPECT_TRUE(same(r.ops[3].gemm.out, k.b.out));
  EXPECT_TRUE(r.ops[1].norm.folded);
}

TEST(MlpBlockOps, Refusals) {
  auto refused = [](auto change) {
    Block k;
    change(k);
    EXPECT_THROW(check_mlp_block(k.w, k.b, kM), InvalidArgument);
  };
  refused([](Block& k) { k.w.gate_up = {}; });
  refused([](Block& k) { k.w.down = {}; });
  refused([](Block& k) { k.w.post_norm = {}; });
  refused([](Block& k) { k.b.residual = {}; });
  refused([](Block& k) { k.w.gate_up = at(2, 2 * kI + 1, kH); });           // odd: no gate/up halves
  refused([](Block& k) { k.w.gate_up = at(2, 2 * kI, kH + 64); });          // K is not H
  refused([](Block& k) { k.w.down = at(3, kH, kI + 64); });                 // K is not I
  refused([](Block& k) { k.w.down = at(3, kH + 64, kI); });                 // N is not H
  refused([](Block& k) { k.w.o_proj = at(0, kH, kA + 64); });               // K is not attn's width
  refused([](Block& k) { k.b.attn = at(6, kM + 1, kA); });                  // rows
  refused([](Block& k) { k.w.o_proj = {}; });                               // attn is then [m, A] != [m, H]
  refused([](Block& k) { k.w.post_norm = at(1, 1, kH - 8); });
  refused([](Block& k) { k.w.next_norm = {}; });                            // qkv without next_norm
  refused([](Block& k) { k.w.qkv = at(5, kQ, kH + 64); });
  refused([](Block& k) { k.b.out = at(8, kM, kH); });                       // out is [m, Q] with qkv
  refused([](Block& k) { k.b.residual = at(7, kM - 1, kH); });
  refused([](Block& k) { k.w.down.dtype = DType::kF32; });
  for (float eps : {-1e-6f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
    refused([eps](Block& k) { k.w.eps = eps; });  // the launch form's norms take it as given
  refused([](Block& k) { k.b.out = at(7, kM, kQ); });                       // out over the residual
  refused([](Block& k) { k.b.attn = TensorView::bf16(static_cast<uint16_t*>(k.b.out.data) + 8, kM, kA); });  // in out
  refused([](Block& k) {  // the residual's last row over attn's first
    k.b.attn = TensorView::bf16(static_cast<uint16_t*>(k.b.residual.data) + (kM - 1) * kH + kH / 2, kM, kA);
  });
  Block k;
  EXPECT_THROW(check_mlp_block(k.w, k.b, kM + 1), InvalidArgument) << "m is not the buffers' rows";
  Block wide;  // 65 rows: above what either form serves
  wide.b = {at(6, 65, kA), at(7, 65, kH), at(8, 65, kQ)};
  EXPECT_THROW(check_mlp_block(wide.w, wide.b, 65), InvalidArgument);
  wide.b = {at(6, 64, kA), at(7, 64, kH), at(8, 64, kQ)};
  EXPECT_NO_THROW(check_mlp_block(wide.w, wide.b, 64));
}

// What the launch form serves: the norm kernel's H and its rows, contiguous and
// 16-byte aligned; the GEMMs take anything.
TEST(MlpBlockOps, TheLaunchesServeTheNormKernelsTensorsOnly) {
  EXPECT_TRUE(launches_serve(Block{}.w, Block{}.b));
  auto refused = [](auto change) {
    Block k;
    change(k);
    EXPECT_FALSE(launches_serve(k.w, k.b));
  };
  refused([](Block& k) { k.b.residual.row_stride = kH + 64; });
  refused([](Block& k) { k.b.residual.data = static_cast<uint16_t*>(k.b.residual.data) + 4; });  // 8-byte aligned
  refused([](Block& k) { k.w.post_norm.data = static_cast<uint16_t*>(k.w.post_norm.data) + 1; });
  refused([](Block& k) { k.w.next_norm.data = static_cast<uint16_t*>(k.w.next_norm.data) + 2; });
  refused([](Block& k) {  // H not a multiple of 64
    k.b.residual = at(7, kM, kH - 8);
    k.w.post_norm = at(1, 1, kH - 8);
  });
  refused([](Block& k) { k.b.residual = at(7, kM, 16384 + 64); });
  refused([](Block& k) {  // no o_proj: the post norm reads attn
    k.w.o_proj = {};
    k.b.attn = at(6, kM, kH);
    k.b.attn.row_stride = kH + 8;
  });
  refused([](Block& k) {  // no qkv: the next norm writes out
    k.w.qkv = {};
    k.b.out = at(8, kM, kH);
    k.b.out.row_stride = kH + 8;
  });
  Block k;  // with o_proj and qkv, attn and out go to GEMMs, which take strided rows
  k.b.attn.row_stride = kA + 8;
  k.b.out.row_stride = kQ + 8;
  EXPECT_TRUE(launches_serve(k.w, k.b));
}

// TeamMlpBlock's choice: the program up to 16 rows on a GPU of the rank's own,
// launches above and wherever ranks share a GPU.
TEST(TeamMlpBlockForm, TheProgramUpTo16RowsOnAGpuOfItsOwn) {
  using Form = TeamMlpBlock::Form;
  for (int m : {1, 8, 16}) EXPECT_EQ(TeamMlpBlock::default_form(m, 1), Form::kProgram) << m;
  for (int m : {17, 32, 64}) EXPECT_EQ(TeamMlpBlock::default_form(m, 1), Form::kLaunches) << m;
  for (int ranks : {2, 4, 8})
    for (int m : {1, 16, 64}) EXPECT_EQ(TeamMlpBlock::default_form(m, ranks), Form::kLaunches) << m << ", " << ranks;
}

}  // namespace
}  // namespace tpdecode::program
