// Bad input gets a clear error before anything reaches a GPU (these run in CI,
// where there is none).
#include <gtest/gtest.h>

#include <string>

#include "core/rank_switch.hpp"
#include "tpdecode/all_reduce.hpp"
#include "tpdecode/device_info.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/local_team.hpp"
#include "tpdecode/nccl_team.hpp"

namespace tpdecode {
namespace {

alignas(16) uint16_t host_rows[4 * 64];

struct FakeCall {
  RankContext ctx;
  Mailbox::View box;
  TensorView x = TensorView::bf16(host_rows, 2, 64);
  TensorView out = TensorView::bf16(host_rows + 128, 2, 64);
  FakeCall() {
    ctx.rank = 1;
    ctx.size = 2;
    box.slots = 2;
    box.rows_cap = 4;
    box.row_bytes = 128;
    box.peers.base[0] = host_rows;
    box.peers.base[1] = host_rows + 8;
  }
};

template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "<no exception>";
}

TEST(Arguments, AllReduceRejectsBadTensors) {
  FakeCall c;
  auto call = [&] { all_reduce(c.ctx, c.box, c.x, c.out); };
  c.x.data = nullptr;
  EXPECT_NE(message_of<InvalidArgument>(call).find("null"), std::string::npos);
  c = FakeCall();
  c.x.dtype = DType::kF32;
  EXPECT_NE(message_of<InvalidArgument>(call).find("dtype"), std::string::npos);
  c = FakeCall();
  c.x.cols = c.out.cols = 60;
  c.x.row_stride = c.out.row_stride = 60;
  EXPECT_NE(message_of<InvalidArgument>(call).find("multiple of 8"), std::string::npos);
  c = FakeCall();
  c.x.row_stride = 72;
  EXPECT_NE(message_of<InvalidArgument>(call).find("contiguous"), std::string::npos);
  c = FakeCall();
  c.x.data = host_rows + 1;
  EXPECT_NE(message_of<InvalidArgument>(call).find("aligned"), std::string::npos);
  c = FakeCall();
  c.out.rows = 1;
  EXPECT_NE(message_of<InvalidArgument>(call).find("rows"), std::string::npos);
}

TEST(Arguments, AllReduceRejectsRowsAboveCapacityAndMismatchedMailbox) {
  FakeCall c;
  c.box.rows_cap = 1;
  EXPECT_NE(message_of<InvalidArgument>([&] { all_reduce(c.ctx, c.box, c.x, c.out); }).find("capacity"),
            std::string::npos);
  c = FakeCall();
  c.box.slots = 4;
  EXPECT_NE(message_of<InvalidArgument>([&] { all_reduce(c.ctx, c.box, c.x, c.out); }).find("slots"),
            std::string::npos);
  c = FakeCall();
  c.box.peers.base[0] = nullptr;
  EXPECT_NE(message_of<InvalidArgument>([&] { all_reduce(c.ctx, c.box, c.x, c.out); }).find("address"),
            std::string::npos);
  c = FakeCall();
  c.box.row_bytes = 64;
  EXPECT_NE(message_of<InvalidArgument>([&] { all_reduce(c.ctx, c.box, c.x, c.out); }).find("mailbox rows"),
            std::string::npos);
}

TEST(Arguments, PendingTimeoutBlocksTheNextCall) {
  FakeCall c;
  MailboxError record{};
  record.flag = 1;
  record.rank = 1;
  record.op = static_cast<int32_t>(CommOp::kAllReduce);
  record.slot = 0;
  c.ctx.error_host = &record;
  const std::string m = message_of<TimeoutError>([&] { all_reduce(c.ctx, c.box, c.x, c.out); });
  EXPECT_NE(m.find("reset()"), std::string::npos) << m;
  EXPECT_NE(m.find("slot 0"), std::string::npos) << m;
}

TEST(Arguments, ErrorRecordIsReadOnlyWhenPresent) {
  MailboxError record{};
  MailboxError e{};
  EXPECT_FALSE(read_error(&record, &e));
  EXPECT_FALSE(read_error(nullptr, &e));
  record.flag = 2;  // a kernel is still writing it: waited for briefly, then reported
  record.slot = 5;
  EXPECT_TRUE(read_error(&record, &e));
  EXPECT_EQ(e.slot, 5);
  EXPECT_EQ(e.flag, 2u);
}

TEST(Arguments, UnsupportedTeamSizes) {
  for (int n : {0, 3, 5, 6, 7, 12, 17, 32}) {
    EXPECT_THROW(LocalTeam team(n), InvalidArgument) << n;
    EXPECT_THROW(with_rank_count(n, [](auto) {}), InvalidArgument) << n;
  }
  EXPECT_EQ(with_rank_count(8, [](auto k) { return decltype(k)::value; }), 8);
}

TEST(Arguments, NoGpuIsReportedPlainly) {
  std::string why;
  if (visible_gpu_count(&why) > 0) GTEST_SKIP() << "a GPU is visible";
  EXPECT_FALSE(why.empty());
  EXPECT_THROW(LocalTeam team(2), Unavailable);
  const SystemInfo s = query_system();
  EXPECT_TRUE(s.gpus.empty());
  EXPECT_FALSE(s.backends.empty());
  EXPECT_FALSE(s.backends[0].serves);
}

TEST(Arguments, RequireRowsNamesTheProblem) {
  TensorView t = TensorView::bf16(host_rows, 2, 64);
  EXPECT_NO_THROW(require_rows(t, DType::kBF16, 64, "t"));
  EXPECT_NE(message_of<InvalidArgument>([&] { require_rows(t, DType::kBF16, 32, "weight"); }).find("weight: 64 columns"),
            std::string::npos);
  t.rows = 0;
  EXPECT_THROW(require_rows(t, DType::kBF16, 64, "t"), InvalidArgument);
}

}  // namespace
}  // namespace tpdecode
