// What the comm layer decides without a GPU (these run in CI): argument checks with
// messages that name the problem, which path serves a call and why, the hidden
// sizes served, the error records and the unsupported team sizes (the automatic
// choice's table: crossover_test.cpp; batch-invariant plans: comm_plan_test.cpp).
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "comm/rules.hpp"
#include "cpu/comm_limits.hpp"
#include "core/rank_switch.hpp"
#include "team/error_record.hpp"
#include "tpdecode/device_info.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/local_team.hpp"

namespace tpdecode {
namespace {

using test::tp8_limits;
using test::with_two_shot;

alignas(16) uint16_t host_rows[8 * 128];
// Distinct fake device addresses, 1 MB apart (the checks read the views' fields,
// never their memory).
void* fake_at(int region) { return reinterpret_cast<void*>(static_cast<uintptr_t>(region) << 20); }

template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "<no exception>";
}

bool mentions(const std::string& message, const char* what) { return message.find(what) != std::string::npos; }

TEST(CommRules, HiddenSizesServedFollowTheNormGeometry) {
  for (int64_t h : {64, 2048, 3584, 4096, 5120, 6144, 7168, 8192, 12288, 16384}) EXPECT_TRUE(ar_norm_hidden_served(h)) << h;
  for (int64_t h : {0, 32, 100, 4000, 7176, 16448, 32768}) EXPECT_FALSE(ar_norm_hidden_served(h)) << h;
}

TEST(CommRules, OneShotServesWhatItsMailboxAndTheGpuHold) {
  const CommLimits l = tp8_limits();
  EXPECT_EQ(one_shot_refusal(l, 1, 7168), "");
  EXPECT_EQ(one_shot_refusal(l, 21, 4096), "");
  EXPECT_TRUE(mentions(one_shot_refusal(l, 22, 7168), "can hold 21"));
  EXPECT_TRUE(mentions(one_shot_refusal(l, 65, 7168), "hold 64"));
  EXPECT_TRUE(mentions(one_shot_refusal(l, 1, 8192), "mailbox rows hold 7168"));
  EXPECT_TRUE(mentions(one_shot_refusal(l, 1, 7164), "16-byte"));
  CommLimits one = l;
  one.team_size = 1;
  EXPECT_TRUE(mentions(one_shot_refusal(one, 1, 7168), "TP 1"));
  CommLimits apart = l;
  apart.shares_memory = false;
  EXPECT_TRUE(mentions(one_shot_refusal(apart, 1, 7168), "do not share memory"));
}

TEST(CommRules, ArNormRefusals) {
  const CommLimits l = tp8_limits();
  EXPECT_EQ(ar_norm_refusal(l, 7, 7168), "");
  EXPECT_EQ(ar_norm_refusal(l, 7, 2048), "");
  EXPECT_TRUE(mentions(ar_norm_refusal(l, 8, 7168), "can hold 7"));
  EXPECT_TRUE(mentions(ar_norm_refusal(l, 1, 7200), "multiples of 64"));
}

TEST(CommRules, GatherRefusesWhatTheSentinelWouldChange) {
  const CommLimits l = tp8_limits();
  EXPECT_EQ(gather_refusal(l, 64, 7168 * 2 / 8, DType::kBF16), "");
  EXPECT_EQ(gather_refusal(l, 64, 7168 * 2 / 8, DType::kF32), "");
  EXPECT_TRUE(mentions(gather_refusal(l, 1, 7168 * 2 / 8, DType::kI32), "INT_MIN"));
  EXPECT_TRUE(mentions(gather_refusal(l, 1, 24, DType::kBF16), "16-byte"));
  EXPECT_TRUE(mentions(gather_refusal(l, 1, 7168 * 2, DType::kBF16), "mailbox rows hold"));
  EXPECT_TRUE(mentions(gather_refusal(l, 65, 16, DType::kBF16), "hold 64"));
}

TEST(CommRules, ChoiceFollowsTheAlgorithmAndTheRefusals) {
  const CommLimits l = tp8_limits();
  EXPECT_EQ(choose_all_reduce(l, CommAlgorithm::kAuto, 4, 7168, true).path, CommPath::kOneShot);
  EXPECT_EQ(choose_all_reduce(l, CommAlgorithm::kOneShot, 4, 7168, false).path, CommPath::kOneShot);
  const CommResult stock = choose_all_reduce(l, CommAlgorithm::kStock, 4, 7168, true);
  EXPECT_EQ(stock.path, CommPath::kStock);
  EXPECT_TRUE(mentions(stock.why, "asked for"));
  const CommResult big = choose_all_reduce(l, CommAlgorithm::kAuto, 40, 7168, true);
  EXPECT_EQ(big.path, CommPath::kStock);
  EXPECT_FALSE(big.why.empty());
}

TEST(CommRules, TwoShotRefusals) {
  const CommLimits l = with_two_shot(tp8_limits(), true);
  for (bool norm : {false, true}) {
    EXPECT_EQ(two_shot_refusal(l, 1, 7168, norm), "");
    EXPECT_EQ(two_shot_refusal(l, 64, 7168, norm), "") << "rows the one-shot refuses";
    EXPECT_EQ(two_shot_refusal(l, 64, 4096, norm), "");
    EXPECT_TRUE(mentions(two_shot_refusal(l, 65, 7168, norm), "hold 64"));
    EXPECT_TRUE(mentions(two_shot_refusal(l, 1, 7168 + 32, norm), norm ? "multiples of 64" : "8 · TP = 64"));
    EXPECT_TRUE(mentions(two_shot_refusal(l, 1, 8192, norm), "mailbox rows hold 7168"));
    CommLimits none = l;
    none.two_shot_rows = none.two_shot_norm_rows = 0;
    EXPECT_TRUE(mentions(two_shot_refusal(none, 1, 7168, norm), "fits on this GPU"));
    CommLimits one = l;
    one.team_size = 1;
    EXPECT_TRUE(mentions(two_shot_refusal(one, 1, 7168, norm), "TP 1"));
    CommLimits apart = l;
    apart.shares_memory = false;
    EXPECT_TRUE(mentions(two_shot_refusal(apart, 1, 7168, norm), "do not share memory"));
  }
  // Whole 16-byte chunks per owner: 8 · TP columns (the one-shot takes any multiple of 8).
  CommLimits tp2 = l;
  tp2.team_size = 2;
  EXPECT_EQ(two_shot_refusal(tp2, 1, 7168 - 16, false), "");
  EXPECT_TRUE(mentions(two_shot_refusal(tp2, 1, 7168 - 8, false), "8 · TP = 16"));
  EXPECT_EQ(one_shot_refusal(tp2, 1, 7168 - 8), "");
}

TEST(CommRules, ForcedTwoShotRunsStockWithTheReasonWhereNotServed) {
  const CommLimits l = with_two_shot(tp8_limits(), true);
  EXPECT_EQ(choose_all_reduce(l, CommAlgorithm::kTwoShot, 64, 7168, true).path, CommPath::kTwoShot);
  const CommResult odd = choose_all_reduce(l, CommAlgorithm::kTwoShot, 2, 7168 + 8, false);
  EXPECT_EQ(odd.path, CommPath::kStock);
  EXPECT_TRUE(mentions(odd.why, "two-shot all_reduce")) << odd.why;
  // Forcing the one-shot never takes the two-shot.
  EXPECT_EQ(choose_all_reduce(l, CommAlgorithm::kOneShot, 40, 7168, false).path, CommPath::kStock);
}

AllReduceIo all_reduce_io() {
  return {TensorView::bf16(host_rows, 2, 64), TensorView::bf16(host_rows + 128, 2, 64)};
}

TEST(CommRules, AllReduceArgumentsNameTheProblem) {
  auto check = [](AllReduceIo io) { return message_of<InvalidArgument>([&] { check_all_reduce(io); }); };
  EXPECT_EQ(check(all_reduce_io()), "<no exception>");
  AllReduceIo io = all_reduce_io();
  io.x.data = nullptr;
  EXPECT_TRUE(mentions(check(io), "null"));
  io = all_reduce_io();
  io.x.dtype = DType::kF32;
  EXPECT_TRUE(mentions(check(io), "dtype f32"));
  io = all_reduce_io();
  io.x.cols = io.out.cols = io.x.row_stride = io.out.row_stride = 60;
  EXPECT_TRUE(mentions(check(io), "multiple of 8"));
  io = all_reduce_io();
  io.x.row_stride = 72;
  EXPECT_TRUE(mentions(check(io), "contiguous"));
  io = all_reduce_io();
  io.x.data = host_rows + 1;
  EXPECT_TRUE(mentions(check(io), "aligned"));
  io = all_reduce_io();
  io.out.rows = 1;
  EXPECT_TRUE(mentions(check(io), "output is [1, 64]"));
  io = all_reduce_io();
  io.x.rows = io.out.rows = 0;
  EXPECT_TRUE(mentions(check(io), "0 rows"));
}

TEST(CommRules, ArNormAndGatherArgumentsNameTheProblem) {
  ArNormIo a;
  a.x = TensorView::bf16(host_rows, 2, 128);
  a.weight = TensorView::bf16(host_rows + 256, 1, 128);
  a.out = TensorView::bf16(host_rows + 384, 2, 128);
  a.residual_out = TensorView::bf16(host_rows + 640, 2, 128);
  EXPECT_NO_THROW(check_ar_norm(a));
  ArNormIo bad = a;
  bad.weight.rows = 2;
  EXPECT_TRUE(mentions(message_of<InvalidArgument>([&] { check_ar_norm(bad); }), "weight is [2, 128]"));
  bad = a;
  bad.x.cols = bad.x.row_stride = 120;
  EXPECT_TRUE(mentions(message_of<InvalidArgument>([&] { check_ar_norm(bad); }), "multiples of 64"));
  // eps: finite and >= 0 (0 is taken: the norm of a zero row is then NaN, as asked).
  for (float eps : {-1e-6f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    bad = a;
    bad.eps = eps;
    EXPECT_TRUE(mentions(message_of<InvalidArgument>([&] { check_ar_norm(bad); }), "eps")) << eps;
  }
  for (float eps : {0.0f, 1e-6f, 1e-5f, 1.0f}) {
    bad = a;
    bad.eps = eps;
    EXPECT_NO_THROW(check_ar_norm(bad)) << eps;
  }

  // FP8 epilogues: an e4m3 output; a static scale of one f32; group scales [rows, hidden / 128] f32, at
  // hidden sizes of whole groups per CTA (multiples of 1024).
  ArNormIo q = a;
  q.x = TensorView::bf16(fake_at(1), 2, 1024);
  q.weight = TensorView::bf16(fake_at(2), 1, 1024);
  q.residual_out = TensorView::bf16(fake_at(3), 2, 1024);
  q.out = TensorView::e4m3(fake_at(4), 2, 1024);
  q.quant = ArNormQuant::kStatic;
  q.scale = TensorView::f32(fake_at(5), 1, 1);
  EXPECT_NO_THROW(check_ar_norm(q));
  q.quant = ArNormQuant::kGroup;
  EXPECT_TRUE(mentions(message_of<InvalidArgument>([&] { check_ar_norm(q); }), "group scales is [1, 1], [2, 8]"));
  q.scale = TensorView::f32(fake_at(5), 2, 8);
  EXPECT_NO_THROW(check_ar_norm(q));
  q.quant = ArNormQuant::kGroupUe8m0;
  EXPECT_NO_THROW(check_ar_norm(q));
  ArNormIo wrong = q;
  wrong.out = TensorView::bf16(fake_at(4), 2, 1024);
  EXPECT_TRUE(mentions(message_of<InvalidArgument>([&] { check_ar_norm(wrong); }), "has dtype bf16, e4m3 is required"));
  wrong = q;
  wrong.scale.data = nullptr;
  EXPECT_TRUE(mentions(message_of<InvalidArgument>([&] { check_ar_norm(wrong); }), "group scales is null"));
  wrong = q;
  wrong.residual_out = TensorView::e4m3(fake_at(3), 2, 1024);
  EXPECT_TRUE(mentions(message_of<InvalidArgument>([&] { check_ar_norm(wrong); }), "residual output has dtype e4m3"));
  wrong = a;  // hidden 128: not whole groups per CTA
  wrong.out = TensorView::e4m3(a.out.data, 2, 128);
  wrong.quant = ArNormQuant::kGroup;
  wrong.scale = TensorView::f32(fake_at(5), 2, 1);
  EXPECT_TRUE(mentions(message_of<InvalidArgument>([&] { check_ar_norm(wrong); }), "multiples of 1024"));
  wrong.quant = ArNormQuant::kStatic;  // the static scale takes any hidden size
  wrong.scale = TensorView::f32(fake_at(5), 1, 1);
  EXPECT_NO_THROW(check_ar_norm(wrong));
  for (int64_t h : {1024, 2048, 5120, 7168, 16384}) EXPECT_TRUE(ar_norm_group_quant_served(h)) << h;
  for (int64_t h : {128, 1536, 2560, 3584, 17408}) EXPECT_FALSE(ar_norm_group_quant_served(h)) << h;

  GatherIo g{TensorView{host_rows, DType::kI32, 2, 8, 8}, TensorView{host_rows + 64, DType::kI32, 2, 16, 16}};
  EXPECT_NO_THROW(check_gather(g, 2));
  EXPECT_TRUE(mentions(message_of<InvalidArgument>([&] { check_gather(g, 4); }), "team of 4"));
  GatherIo odd = g;
  odd.shard = TensorView::bf16(host_rows, 2, 3);
  odd.out = TensorView::bf16(host_rows + 64, 2, 6);
  EXPECT_TRUE(mentions(message_of<InvalidArgument>([&] { check_gather(odd, 2); }), "multiple of 4"));
}

// An output over another operand is refused (the kernels' threads read and write
// them in no common order; the stock and mailbox paths would differ), but for the
// in-place forms the calls document: all_reduce's out as x, ar_norm's residual_out
// as its residual, each the same view.
TEST(CommRules, OutputsOverOtherOperandsAreRefusedButTheDocumentedInPlaceForms) {
  auto all_reduce_message = [](const AllReduceIo& io) {
    return message_of<InvalidArgument>([&] { check_all_reduce(io); });
  };
  const TensorView x = TensorView::bf16(fake_at(1), 4, 256);
  EXPECT_EQ(all_reduce_message({x, x}), "<no exception>");
  const TensorView shifted = TensorView::bf16(static_cast<uint16_t*>(fake_at(1)) + 256, 4, 256);  // a row on
  EXPECT_TRUE(mentions(all_reduce_message({x, shifted}), "output")) << all_reduce_message({x, shifted});
  EXPECT_TRUE(mentions(all_reduce_message({x, shifted}), "overlaps input"));

  ArNormIo a;
  a.x = x;
  a.residual = TensorView::bf16(fake_at(2), 4, 256);
  a.weight = TensorView::bf16(fake_at(3), 1, 256);
  a.out = TensorView::bf16(fake_at(4), 4, 256);
  a.residual_out = a.residual;  // in place
  EXPECT_NO_THROW(check_ar_norm(a));
  auto refused = [&](auto change, const char* what) {
    ArNormIo bad = a;
    change(bad);
    const std::string m = message_of<InvalidArgument>([&] { check_ar_norm(bad); });
    EXPECT_TRUE(mentions(m, "overlaps")) << what << ": " << m;
  };
  // The paths store out and the residual output in different orders.
  refused([&](ArNormIo& b) { b.out = b.residual_out; }, "out as the residual output");
  refused([&](ArNormIo& b) { b.out = shifted; }, "out a row into x");
  refused([&](ArNormIo& b) { b.residual_out = x; }, "residual output as x (not a documented in-place form)");
  refused([&](ArNormIo& b) { b.out = TensorView::bf16(fake_at(3), 4, 256); }, "out over the weight");
  refused([&](ArNormIo& b) { b.residual_out = TensorView::bf16(static_cast<uint16_t*>(fake_at(2)) + 8, 4, 256); },
          "residual output shifted from the residual");
  ArNormIo q = a;  // FP8: an e4m3 out at x's address is not x's view
  q.x = TensorView::bf16(fake_at(1), 4, 1024);
  q.residual = q.residual_out = TensorView::bf16(fake_at(2), 4, 1024);
  q.weight = TensorView::bf16(fake_at(3), 1, 1024);
  q.out = TensorView::e4m3(fake_at(4), 4, 1024);
  q.quant = ArNormQuant::kGroup;
  q.scale = TensorView::f32(fake_at(5), 4, 8);
  EXPECT_NO_THROW(check_ar_norm(q));
  ArNormIo bad = q;
  bad.out = TensorView::e4m3(fake_at(1), 4, 1024);
  EXPECT_TRUE(mentions(message_of<InvalidArgument>([&] { check_ar_norm(bad); }), "overlaps input"));
  bad = q;
  bad.scale = TensorView::f32(fake_at(3), 4, 8);  // group scales (written) over the weight
  EXPECT_TRUE(mentions(message_of<InvalidArgument>([&] { check_ar_norm(bad); }), "group scales"));
  bad = q;
  bad.quant = ArNormQuant::kStatic;  // a static scale is read: an output over it is refused
  bad.scale = TensorView::f32(static_cast<uint8_t*>(fake_at(4)) + 64, 1, 1);
  EXPECT_TRUE(mentions(message_of<InvalidArgument>([&] { check_ar_norm(bad); }), "static scale"));

  GatherIo g{TensorView::bf16(fake_at(1), 2, 64), TensorView::bf16(fake_at(2), 2, 128)};
  EXPECT_NO_THROW(check_gather(g, 2));
  g.out = TensorView::bf16(static_cast<uint16_t*>(fake_at(1)) + 64, 2, 128);
  EXPECT_TRUE(mentions(message_of<InvalidArgument>([&] { check_gather(g, 2); }), "overlaps shard"));
}

TEST(CommRules, ErrorRecordsAreDescribedAndReadOnlyWhenComplete) {
  lamport::ErrorRecord record{};
  lamport::ErrorRecord e{};
  EXPECT_FALSE(read_error_record(&record, &e));
  EXPECT_FALSE(read_error_record(nullptr, &e));
  record = {1, static_cast<int32_t>(lamport::ErrorKind::kTimeout), 2, static_cast<int32_t>(lamport::Op::kArNorm), 1,
            3, 0, 16};
  ASSERT_TRUE(read_error_record(&record, &e));
  const std::string timeout = describe_error(e);
  for (const char* part : {"rank 2", "ar_norm", "parity 1", "slot 3", "reset()"})
    EXPECT_TRUE(mentions(timeout, part)) << timeout;
  record.kind = static_cast<int32_t>(lamport::ErrorKind::kAborted);
  record.flag = 2;  // a kernel is still writing it: waited for briefly, then reported
  ASSERT_TRUE(read_error_record(&record, &e));
  EXPECT_TRUE(mentions(describe_error(e), "rank 3 timed out and aborted the team")) << describe_error(e);
}

TEST(CommRules, UnsupportedTeamSizes) {
  for (int n : {0, 3, 5, 6, 7, 12, 17, 32}) {
    EXPECT_THROW(LocalTeam team(n), InvalidArgument) << n;
    EXPECT_THROW(with_rank_count(n, [](auto) {}), InvalidArgument) << n;
  }
  EXPECT_EQ(with_rank_count(8, [](auto k) { return decltype(k)::value; }), 8);
}

TEST(CommRules, NoGpuIsReportedPlainly) {
  std::string why;
  if (visible_gpu_count(&why) > 0) GTEST_SKIP() << "a GPU is visible";
  EXPECT_FALSE(why.empty());
  EXPECT_THROW(LocalTeam team(2), Unavailable);
  const SystemInfo s = query_system();
  EXPECT_TRUE(s.gpus.empty());
  EXPECT_FALSE(s.backends.empty());
  EXPECT_FALSE(s.backends[0].serves);
}

}  // namespace
}  // namespace tpdecode
