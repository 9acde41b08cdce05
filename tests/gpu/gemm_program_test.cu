// GemmProgram on the GPU: chains whose ops read the previous op's outputs (the
// dependency respected: intermediate buffers start poisoned), against an FP64
// reference computed from each op's actual input; every element written; bitwise
// repeatable; the same bits in a CUDA graph, over 10,000 runs back to back and with PDL;
// the SiLU-mul epilogue gives the SiLU-mul kernel's bits and feeds a down
// projection; norm ops give their CPU reference's bits; refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "core/bf16.hpp"
#include "core/silu_mul_launch.hpp"
#include "gpu/gpu_test_util.hpp"
#include "gpu/program_runs.hpp"
#include "reference/program_norm.hpp"
#include "tpdecode/gemm_program.hpp"

namespace tpdecode {
namespace {

using namespace test;

// out[m, n] (row stride n) against FP64 on x[m, k] (row stride x_stride) and
// w[n, k]: every element written, relative error of the BF16 rounding's order.
void check_op(const std::vector<uint16_t>& x, int64_t k, const std::vector<uint16_t>& w,
              const std::vector<uint16_t>& got, int64_t n, int m, int64_t x_stride = 0, int64_t x_col = 0) {
  if (x_stride == 0) x_stride = k;
  double err = 0, norm = 0;
  for (int t = 0; t < m; ++t)
    for (int64_t j = 0; j < n; ++j) {
      const uint16_t g = got[static_cast<std::size_t>(t * n + j)];
      ASSERT_NE(g, kPoison16) << "unwritten: token " << t << ", column " << j;
      double ref = 0;
      for (int64_t c = 0; c < k; ++c)
        ref += static_cast<double>(bf16::to_float(x[static_cast<std::size_t>(t * x_stride + x_col + c)])) *
               bf16::to_float(w[static_cast<std::size_t>(j * k + c)]);
      const double d = bf16::to_float(g) - ref;
      ASSERT_TRUE(std::isfinite(d)) << "token " << t << ", column " << j;
      err += d * d;
      norm += ref * ref;
    }
  EXPECT_LT(std::sqrt(err / norm), 4e-3);
}

// A chain of GEMMs: op i maps width dims[i] to dims[i + 1] (op i's N is the next
// op's K), or, with `independent`, every op reads its own input.
struct Chain {
  int m;
  std::vector<int64_t> dims;
  std::vector<DeviceBuffer> weights, acts;  // acts[i]: op i's x; acts[i + 1]: op i's out (chained)
  std::vector<std::vector<uint16_t>> w_host;
  std::vector<GemmProgram::Gemm> gemms;
  std::vector<DeviceBuffer> outs;  // independent ops' outputs

  Chain(int m_, std::vector<int64_t> dims_, bool independent, std::mt19937_64& rng) : m(m_), dims(std::move(dims_)) {
    const std::size_t ops = dims.size() - 1;
    for (std::size_t i = 0; i < ops; ++i) {
      w_host.push_back(random_bf16(static_cast<std::size_t>(dims[i + 1] * dims[i]), rng, 0.05f));
      weights.push_back(to_device(w_host.back()));
    }
    for (std::size_t i = 0; i <= ops; ++i) acts.emplace_back(static_cast<std::size_t>(m * dims[i]) * 2);
    for (std::size_t i = 0; i < ops; ++i) {
      GemmProgram::Gemm g;
      g.weight = TensorView::bf16(weights[i].get(), dims[i + 1], dims[i]);
      if (independent) {
        outs.emplace_back(static_cast<std::size_t>(m * dims[i + 1]) * 2);
        g.x = TensorView::bf16(acts[i].get(), m, dims[i]);
        g.out = TensorView::bf16(outs.back().get(), m, dims[i + 1]);
      } else {
        g.x = TensorView::bf16(acts[i].get(), m, dims[i]);
        g.out = TensorView::bf16(acts[i + 1].get(), m, dims[i + 1]);
        g.after = i == 0 ? -1 : static_cast<int>(i - 1);
      }
      gemms.push_back(g);
    }
  }
  DeviceBuffer& out(std::size_t i) { return outs.empty() ? acts[i + 1] : outs[i]; }
  std::vector<GemmProgram::Op> ops() const { return {gemms.begin(), gemms.end()}; }
  // Fresh inputs: the chain's first x (every op's x when independent); every
  // output poisoned.
  void fresh(std::mt19937_64& rng) {
    for (std::size_t i = 0; i < gemms.size(); ++i) {
      if (i == 0 || !outs.empty()) upload(acts[i], random_bf16(static_cast<std::size_t>(m * dims[i]), rng).data(),
                                          static_cast<std::size_t>(m * dims[i]) * 2);
      if (!outs.empty()) poison(outs[i]);
    }
    if (outs.empty())
      for (std::size_t i = 1; i < acts.size(); ++i) poison(acts[i]);
    // The poisons (on the legacy stream) before the runs, on streams that need not wait for it.
    TPD_CUDA(cudaDeviceSynchronize());
  }
  // All outputs' bits.
  std::vector<std::vector<uint16_t>> bits() {
    std::vector<std::vector<uint16_t>> b;
    for (std::size_t i = 0; i < gemms.size(); ++i)
      b.push_back(to_host<uint16_t>(out(i), static_cast<std::size_t>(m * dims[i + 1])));
    return b;
  }
  // Op i against FP64 on its actual input.
  void check_values() {
    for (std::size_t i = 0; i < gemms.size(); ++i) {
      SCOPED_TRACE(testing::Message() << "op " << i << " [" << dims[i + 1] << ", " << dims[i] << "]");
      const std::vector<uint16_t> x = to_host<uint16_t>(acts[i], static_cast<std::size_t>(m * dims[i]));
      const std::vector<uint16_t> got = to_host<uint16_t>(out(i), static_cast<std::size_t>(m * dims[i + 1]));
      check_op(x, dims[i], w_host[i], got, dims[i + 1], m);
    }
  }
  // One run of `program` on `stream`, checked against FP64; its bits.
  std::vector<std::vector<uint16_t>> checked_run(const GemmProgram& program, cudaStream_t stream) {
    program.run(stream);
    TPD_CUDA(cudaStreamSynchronize(stream));
    check_values();
    return bits();
  }
};

void check_chain(int m, const std::vector<int64_t>& dims, bool independent, std::mt19937_64& rng) {
  SCOPED_TRACE(testing::Message() << "m " << m << (independent ? ", independent ops" : ", chained"));
  Chain c(m, dims, independent, rng);
  GemmProgram program(c.ops(), m);
  c.fresh(rng);
  const auto first = c.checked_run(program, nullptr);
  // Again, back to back with PDL (the second run's start overlaps the first's tail).
  for (std::size_t i = 0; i < c.gemms.size(); ++i) poison(c.out(i));
  program.run(nullptr, true);
  program.run(nullptr, true);
  TPD_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(c.bits() == first) << "a second run differs";
}

TEST(GemmProgram, ChainsAgreeWithTheReference) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  const std::vector<int64_t> dims = {1024, 1536, 704, 2048, 64, 4096, 1000};
  for (int m : {1, 3, 8, 9, 16, 17, 28, 32, 33, 64}) {
    if (quick() && m % 8 != 1) continue;
    check_chain(m, dims, false, rng);
  }
  check_chain(5, {7168, 2112, 1536}, false, rng);
}

TEST(GemmProgram, IndependentOps) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  for (int m : {2, 24, 64}) check_chain(m, {512, 3072, 128, 64, 2304}, true, rng);
}

// Two runs of a program captured in a CUDA graph, on a stream of their own (which
// the eager runs of a test use too).
struct TwoRunGraph {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  explicit TwoRunGraph(const GemmProgram& program) {
    TPD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    TPD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    program.run(stream);
    program.run(stream);
    TPD_CUDA(cudaStreamEndCapture(stream, &graph));
    TPD_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  }
  ~TwoRunGraph() {
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
  void launch() const { TPD_CUDA(cudaGraphLaunch(exec, stream)); }
};

// The chain the graph tests replay: 7 rows through four chained ops, as one
// program in a graph of two runs.
struct ReplayedChain {
  Chain c;
  GemmProgram program;
  TwoRunGraph g;
  explicit ReplayedChain(std::mt19937_64& rng)
      : c(7, {2048, 4096, 1024, 2048}, false, rng), program(c.ops(), 7), g(program) {}
  // Fresh inputs and a checked eager run, whose bits it returns; then the outs
  // poisoned on the graph's stream, ordered before the next replay.
  std::vector<std::vector<uint16_t>> eager_then_poison(std::mt19937_64& rng) {
    c.fresh(rng);
    auto eager = c.checked_run(program, g.stream);
    for (std::size_t i = 1; i < c.acts.size(); ++i) poison(c.acts[i], g.stream);
    return eager;
  }
};

TEST(GemmProgram, GraphReplaysGiveTheEagerBits) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  ReplayedChain r(rng);
  for (int replay = 0; replay < 3; ++replay) {
    const auto eager = r.eager_then_poison(rng);
    r.g.launch();
    TPD_CUDA(cudaStreamSynchronize(r.g.stream));
    EXPECT_TRUE(r.c.bits() == eager) << "replay " << replay;
  }
}

// 10,000 runs back to back (a graph of two runs replayed 5,000 times, nothing
// between them): the counters, epochs and scratch slots reset themselves, so the
// last run gives the eager run's bits.
TEST(GemmProgram, TenThousandRunsBackToBack) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  ReplayedChain r(rng);
  const auto eager = r.eager_then_poison(rng);
  const int replays = quick() ? 100 : 5000;
  for (int replay = 0; replay < replays; ++replay) r.g.launch();
  TPD_CUDA(cudaStreamSynchronize(r.g.stream));
  EXPECT_TRUE(r.c.bits() == eager) << 2 * replays << " runs";
}

// x as column windows of an earlier op's out, as a layer's q_a / kv_a split reads
// its fused projection: op 0 [2112, k0]; op 1 reads its columns 0..1535, op 2
// columns 1536..2111; op 3 reads op 1's columns 512..1535.
TEST(GemmProgram, WindowsOfAnEarlierOut) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  for (int m : {1, 6, 16, 40}) {
    SCOPED_TRACE(testing::Message() << "m " << m);
    const int64_t k0 = 1024;
    struct Op {
      int64_t n, k;
      int after;
      int64_t col;
    };
    const std::vector<Op> ops = {{2112, k0, -1, 0}, {1536, 1536, 0, 0}, {704, 576, 0, 1536}, {320, 1024, 1, 512}};
    std::vector<std::vector<uint16_t>> w;
    std::vector<DeviceBuffer> wd, outs;
    const std::vector<uint16_t> x0 = random_bf16(static_cast<std::size_t>(m * k0), rng);
    DeviceBuffer x0d = to_device(x0);
    std::vector<GemmProgram::Gemm> gemms;
    for (const Op& op : ops) {
      w.push_back(random_bf16(static_cast<std::size_t>(op.n * op.k), rng, 0.05f));
      wd.push_back(to_device(w.back()));
      outs.emplace_back(static_cast<std::size_t>(m * op.n) * 2);
      poison(outs.back());
      GemmProgram::Gemm g;
      g.weight = TensorView::bf16(wd.back().get(), op.n, op.k);
      g.out = TensorView::bf16(outs.back().get(), m, op.n);
      g.after = op.after;
      if (op.after < 0) {
        g.x = TensorView::bf16(x0d.get(), m, k0);
      } else {
        const Op& from = ops[static_cast<std::size_t>(op.after)];
        g.x = TensorView::bf16(static_cast<uint16_t*>(outs[static_cast<std::size_t>(op.after)].get()) + op.col, m,
                               op.k);
        g.x.row_stride = from.n;
      }
      gemms.push_back(g);
    }
    GemmProgram program({gemms.begin(), gemms.end()}, m);
    std::vector<std::uint16_t> bits;
    for (int run = 0; run < 3; ++run) {
      for (DeviceBuffer& o : outs) poison(o);
      program.run(nullptr, run > 0);
      TPD_CUDA(cudaDeviceSynchronize());
      std::vector<std::vector<uint16_t>> got;
      for (std::size_t i = 0; i < ops.size(); ++i)
        got.push_back(to_host<uint16_t>(outs[i], static_cast<std::size_t>(m * ops[i].n)));
      for (std::size_t i = 0; i < ops.size(); ++i) {
        SCOPED_TRACE(testing::Message() << "op " << i << ", run " << run);
        const Op& op = ops[i];
        if (op.after < 0)
          check_op(x0, op.k, w[i], got[i], op.n, m);
        else
          check_op(got[static_cast<std::size_t>(op.after)], op.k, w[i], got[i], op.n, m,
                   ops[static_cast<std::size_t>(op.after)].n, op.col);
      }
      std::vector<uint16_t> all;
      for (const auto& g : got) all.insert(all.end(), g.begin(), g.end());
      if (run == 0) bits = all;
      else EXPECT_TRUE(all == bits) << "run " << run << " differs";
    }
  }
}

// [m, n] bf16 of a device buffer with row stride n.
std::vector<uint16_t> host_bits(DeviceBuffer& d, int m, int64_t n) {
  return to_host<uint16_t>(d, static_cast<std::size_t>(m * n));
}

// The SiLU-mul epilogue against the drafter's kernel on a plain gate_up's out, bit
// for bit: with K 128 no block's K steps are split, so each gate and up value is the
// same sum in both programs (a split K sums each block's parts in an order of its own,
// and the gated blocks are other rows). I 1048: the last block holds 24 gate rows.
// Two ops write disjoint column windows of one [m, 2048] buffer (as a fused q / kv
// output would be), a column gap and the tail left alone; later ops read each window.
// Every op agrees with the reference, the gaps stay as they were, the bits repeat.
TEST(GemmProgram, OutsInColumnWindowsOfOneBuffer) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  constexpr int64_t kWidth = 2048, kK0 = 1024;
  for (int m : {1, 7, 24}) {
    SCOPED_TRACE(testing::Message() << "m " << m);
    struct Op {
      int64_t n, k;
      int after;
      int64_t col;  // x: the column of its window of op `after`'s out; out (after -1): its column in the buffer
    };
    // Ops 0 and 1 write columns [0, 1536) and [1600, 1984) of the buffer; 2 and 3 read them.
    const std::vector<Op> ops = {{1536, kK0, -1, 0}, {384, kK0, -1, 1600}, {256, 1536, 0, 0}, {320, 384, 1, 0}};
    const std::vector<uint16_t> x0 = random_bf16(static_cast<std::size_t>(m * kK0), rng);
    DeviceBuffer x0d = to_device(x0), fused(static_cast<std::size_t>(m * kWidth) * 2);
    std::vector<std::vector<uint16_t>> w;
    std::vector<DeviceBuffer> wd, outs;  // outs: ops 2 and 3
    std::vector<GemmProgram::Gemm> gemms;
    for (const Op& op : ops) {
      w.push_back(random_bf16(static_cast<std::size_t>(op.n * op.k), rng, 0.05f));
      wd.push_back(to_device(w.back()));
      GemmProgram::Gemm g;
      g.weight = TensorView::bf16(wd.back().get(), op.n, op.k);
      g.after = op.after;
      if (op.after < 0) {
        g.x = TensorView::bf16(x0d.get(), m, kK0);
        g.out = TensorView::bf16(static_cast<uint16_t*>(fused.get()) + op.col, m, op.n);
        g.out.row_stride = kWidth;
      } else {
        g.x = TensorView::bf16(static_cast<uint16_t*>(fused.get()) + ops[static_cast<std::size_t>(op.after)].col + op.col,
                               m, op.k);
        g.x.row_stride = kWidth;
        outs.emplace_back(static_cast<std::size_t>(m * op.n) * 2);
        g.out = TensorView::bf16(outs.back().get(), m, op.n);
      }
      gemms.push_back(g);
    }
    GemmProgram program({gemms.begin(), gemms.end()}, m);
    std::vector<uint16_t> bits;
    for (int run = 0; run < 3; ++run) {
      poison(fused);
      for (DeviceBuffer& o : outs) poison(o);
      program.run(nullptr, run > 0);
      TPD_CUDA(cudaDeviceSynchronize());
      const std::vector<uint16_t> all = to_host<uint16_t>(fused, static_cast<std::size_t>(m * kWidth));
      auto window = [&](int64_t col, int64_t n) {
        std::vector<uint16_t> v;
        for (int t = 0; t < m; ++t)
          v.insert(v.end(), all.begin() + t * kWidth + col, all.begin() + t * kWidth + col + n);
        return v;
      };
      for (int t = 0; t < m; ++t)
        for (int64_t c : {int64_t{1536}, int64_t{1599}, int64_t{1984}, kWidth - 1})
          ASSERT_EQ(all[static_cast<std::size_t>(t * kWidth + c)], kPoison16) << "token " << t << ", column " << c;
      std::vector<uint16_t> got_bits = all;
      for (std::size_t i = 0; i < ops.size(); ++i) {
        SCOPED_TRACE(testing::Message() << "op " << i << ", run " << run);
        const Op& op = ops[i];
        if (op.after < 0) {
          check_op(x0, op.k, w[i], window(op.col, op.n), op.n, m);
        } else {
          const std::vector<uint16_t> got = to_host<uint16_t>(outs[i - 2], static_cast<std::size_t>(m * op.n));
          check_op(all, op.k, w[i], got, op.n, m, kWidth, ops[static_cast<std::size_t>(op.after)].col);
          got_bits.insert(got_bits.end(), got.begin(), got.end());
        }
      }
      if (run == 0) bits = got_bits;
      else EXPECT_TRUE(got_bits == bits) << "run " << run << " differs";
    }
  }
}

TEST(GemmProgram, SiluMulEpilogueGivesTheSiluMulKernelsBits) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  const int64_t k = 128;
  for (int64_t inter : {1048, 2304}) {
    DeviceBuffer w = to_device(random_bf16(static_cast<std::size_t>(2 * inter * k), rng, 0.05f));
    for (int m : {1, 5, 8, 16, 28, 64}) {
      if (quick() && m != 5 && m != 28) continue;
      SCOPED_TRACE(testing::Message() << "I " << inter << ", m " << m);
      DeviceBuffer x = to_device(random_bf16(static_cast<std::size_t>(m * k), rng));
      DeviceBuffer gate_up(static_cast<std::size_t>(m * 2 * inter) * 2);
      DeviceBuffer want(static_cast<std::size_t>(m * inter) * 2), got(static_cast<std::size_t>(m * inter) * 2);
      const TensorView weight = TensorView::bf16(w.get(), 2 * inter, k), xv = TensorView::bf16(x.get(), m, k);
      const GemmProgram plain({GemmProgram::Gemm{weight, xv, TensorView::bf16(gate_up.get(), m, 2 * inter)}}, m);
      const GemmProgram gated(
          {GemmProgram::Gemm{weight, xv, TensorView::bf16(got.get(), m, inter), -1, GemmProgram::Epilogue::kSiluMul}},
          m);
      for (DeviceBuffer* b : {&gate_up, &want, &got}) poison(*b);
      plain.run(nullptr);
      launch_silu_mul(nullptr, TensorView::bf16(gate_up.get(), m, 2 * inter),
                               TensorView::bf16(want.get(), m, inter), false);
      gated.run(nullptr);
      TPD_CUDA(cudaDeviceSynchronize());
      const std::vector<uint16_t> expected = host_bits(want, m, inter), actual = host_bits(got, m, inter);
      std::size_t differ = 0;
      for (std::size_t i = 0; i < expected.size(); ++i) differ += expected[i] != actual[i];
      EXPECT_EQ(differ, 0u) << "of " << expected.size() << " values differ from the SiLU-mul kernel's";
    }
  }
}

// An MLP's gate_up (SiLU-mul epilogue) -> down as one program: the activation
// against FP64 (gate and up in FP64, then silu(gate) * up), down bit for bit what
// the same down op gives alone on that activation (the plan cuts each op's work the
// same way in both), both repeatable over runs back to back with PDL.
TEST(GemmProgram, SiluMulEpilogueFeedsTheDownProjection) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  const int64_t k0 = 1024, inter = 1088, n = 1536;
  const std::vector<uint16_t> w_gate_up = random_bf16(static_cast<std::size_t>(2 * inter * k0), rng, 0.05f);
  const std::vector<uint16_t> w_down = random_bf16(static_cast<std::size_t>(n * inter), rng, 0.05f);
  DeviceBuffer gate_up_w = to_device(w_gate_up), down_w = to_device(w_down);
  for (int m : {1, 5, 8, 16, 28, 64}) {
    if (quick() && m != 5 && m != 28) continue;
    SCOPED_TRACE(testing::Message() << "m " << m);
    const std::vector<uint16_t> x_host = random_bf16(static_cast<std::size_t>(m * k0), rng);
    DeviceBuffer x = to_device(x_host);
    DeviceBuffer act(static_cast<std::size_t>(m * inter) * 2), act_copy(static_cast<std::size_t>(m * inter) * 2);
    DeviceBuffer down(static_cast<std::size_t>(m * n) * 2), down_alone(static_cast<std::size_t>(m * n) * 2);
    const GemmProgram mlp({GemmProgram::Gemm{TensorView::bf16(gate_up_w.get(), 2 * inter, k0), TensorView::bf16(x.get(), m, k0),
                            TensorView::bf16(act.get(), m, inter), -1, GemmProgram::Epilogue::kSiluMul},
                           GemmProgram::Gemm{TensorView::bf16(down_w.get(), n, inter), TensorView::bf16(act.get(), m, inter),
                            TensorView::bf16(down.get(), m, n), 0}},
                          m);
    const GemmProgram alone({GemmProgram::Gemm{TensorView::bf16(down_w.get(), n, inter), TensorView::bf16(act_copy.get(), m, inter),
                              TensorView::bf16(down_alone.get(), m, n)}},
                            m);
    std::vector<uint16_t> act_bits, down_bits;
    for (int run = 0; run < 3; ++run) {
      SCOPED_TRACE(testing::Message() << "run " << run);
      poison(act);
      poison(down);
      TPD_CUDA(cudaDeviceSynchronize());
      mlp.run(nullptr, run > 0);
      if (run == 1) continue;  // run 2 follows it back to back
      TPD_CUDA(cudaDeviceSynchronize());
      if (run == 0) {
        act_bits = host_bits(act, m, inter);
        down_bits = host_bits(down, m, n);
        continue;
      }
      EXPECT_TRUE(host_bits(act, m, inter) == act_bits) << "the activation differs from run 0's";
      EXPECT_TRUE(host_bits(down, m, n) == down_bits) << "down differs from run 0's";
    }
    // The activation against FP64.
    double err = 0, norm = 0;
    for (int t = 0; t < m; ++t)
      for (int64_t j = 0; j < inter; ++j) {
        double gate = 0, up = 0;
        for (int64_t c = 0; c < k0; ++c) {
          const double xv = bf16::to_float(x_host[static_cast<std::size_t>(t * k0 + c)]);
          gate += xv * bf16::to_float(w_gate_up[static_cast<std::size_t>(j * k0 + c)]);
          up += xv * bf16::to_float(w_gate_up[static_cast<std::size_t>((inter + j) * k0 + c)]);
        }
        const uint16_t g = act_bits[static_cast<std::size_t>(t * inter + j)];
        ASSERT_NE(g, kPoison16) << "unwritten: token " << t << ", column " << j;
        const double ref = gate / (1 + std::exp(-gate)) * up, d = bf16::to_float(g) - ref;
        ASSERT_TRUE(std::isfinite(d)) << "token " << t << ", column " << j;
        err += d * d;
        norm += ref * ref;
      }
    EXPECT_LT(std::sqrt(err / norm), 8e-3);
    // Down alone on the same activation: the same bits.
    TPD_CUDA(cudaMemcpy(act_copy.get(), act.get(), act.bytes(), cudaMemcpyDeviceToDevice));
    poison(down_alone);
    alone.run(nullptr);
    TPD_CUDA(cudaDeviceSynchronize());
    EXPECT_TRUE(host_bits(down_alone, m, n) == down_bits) << "down differs from down alone on its activation";
    check_op(act_bits, inter, w_down, down_bits, n, m);
  }
}

// [m, cols] bf16 of a device matrix with row stride `stride` from column `col`.
std::vector<uint16_t> host_window(DeviceBuffer& d, int m, int64_t stride, int64_t col, int64_t cols) {
  const std::vector<uint16_t> all = to_host<uint16_t>(d, static_cast<std::size_t>(m * stride));
  std::vector<uint16_t> w;
  for (int t = 0; t < m; ++t)
    w.insert(w.end(), all.begin() + t * stride + col, all.begin() + t * stride + col + cols);
  return w;
}

// Norm ops as a layer uses them, against reference/program_norm.hpp bit for bit:
// op 0 a GEMM p; op 1 residual add + norm of p (residual an input, residual_out h);
// op 2 a GEMM of op 1's out; op 3 the add + norm of op 2's out on the residual
// stream h, in place; op 4 a GEMM of op 3's out; op 5 a norm of an input (its
// residual_out x itself); ops 6 and
// 7 norms of two column windows of p (the q_a / kv pair). The GEMMs against FP64 on
// the norms' outputs; all bits repeatable over runs back to back with PDL.
TEST(GemmProgram, NormsGiveTheirReferenceBits) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  const int64_t k0 = 1024, d = 1536, n4 = 704, kin = 512;
  const float eps = 1e-6f;
  const std::vector<uint16_t> w0 = random_bf16(static_cast<std::size_t>(d * k0), rng, 0.05f);
  const std::vector<uint16_t> w2 = random_bf16(static_cast<std::size_t>(d * d), rng, 0.05f);
  const std::vector<uint16_t> w4 = random_bf16(static_cast<std::size_t>(n4 * d), rng, 0.05f);
  std::vector<std::vector<uint16_t>> gammas;
  for (int64_t k : {d, d, kin, int64_t{1024}, int64_t{512}}) gammas.push_back(random_bf16(static_cast<std::size_t>(k), rng));
  DeviceBuffer w0d = to_device(w0), w2d = to_device(w2), w4d = to_device(w4);
  std::vector<DeviceBuffer> gd;
  for (const auto& g : gammas) gd.push_back(to_device(g));
  for (int m : {1, 5, 8, 16, 28, 64}) {
    if (quick() && m != 5 && m != 28) continue;
    SCOPED_TRACE(testing::Message() << "m " << m);
    const std::vector<uint16_t> x0 = random_bf16(static_cast<std::size_t>(m * k0), rng);
    const std::vector<uint16_t> resid = random_bf16(static_cast<std::size_t>(m * d), rng, 2.0f);
    const std::vector<uint16_t> xin = random_bf16(static_cast<std::size_t>(m * kin), rng, 3.0f);
    DeviceBuffer x0d = to_device(x0), rd = to_device(resid), xind = to_device(xin);
    auto buffer = [&](int64_t cols) { return DeviceBuffer(static_cast<std::size_t>(m * cols) * 2); };
    DeviceBuffer p = buffer(d), x1 = buffer(d), h = buffer(d), q = buffer(d), x2 = buffer(d), s = buffer(n4),
                 x3 = buffer(kin), h5 = buffer(kin), xa = buffer(1024), xb = buffer(512);
    auto view = [&](DeviceBuffer& b, int64_t cols) { return TensorView::bf16(b.get(), m, cols); };
    auto gamma = [&](int i, int64_t k) { return TensorView::bf16(gd[static_cast<std::size_t>(i)].get(), 1, k); };
    TensorView pa = view(p, 1024), pb = TensorView::bf16(static_cast<uint16_t*>(p.get()) + 1024, m, 512);
    pa.row_stride = pb.row_stride = d;
    GemmProgram::Norm n1{view(p, d), 0, gamma(0, d), eps, view(rd, d), view(h, d), view(x1, d)};
    GemmProgram::Norm n3{view(q, d), 2, gamma(1, d), eps, view(h, d), view(h, d), view(x2, d)};
    GemmProgram::Norm n5{view(xind, kin), -1, gamma(2, kin), eps, {}, view(h5, kin), view(x3, kin)};
    GemmProgram::Norm n6{pa, 0, gamma(3, 1024), eps, {}, {}, view(xa, 1024)};
    GemmProgram::Norm n7{pb, 0, gamma(4, 512), eps, {}, {}, view(xb, 512)};
    const GemmProgram program({GemmProgram::Gemm{TensorView::bf16(w0d.get(), d, k0), view(x0d, k0), view(p, d)}, n1,
                               GemmProgram::Gemm{TensorView::bf16(w2d.get(), d, d), view(x1, d), view(q, d), 1}, n3,
                               GemmProgram::Gemm{TensorView::bf16(w4d.get(), n4, d), view(x2, d), view(s, n4), 3}, n5,
                               n6, n7},
                              m);
    const std::vector<std::vector<uint16_t>> bits =
        repeatable_bits(program, {&p, &x1, &h, &q, &x2, &s, &x3, &xa, &xb, &h5});
    const int ctas = program.ctas();
    const auto& [pb_, x1b, hb, qb, x2b, sb, x3b, xab, xbb] =
        std::tie(bits[0], bits[1], bits[2], bits[3], bits[4], bits[5], bits[6], bits[7], bits[8]);
    const reference::ArNormResult r1 = reference::program_norm(pb_, resid, gammas[0], eps, d, ctas);
    EXPECT_TRUE(x1b == r1.out) << "op 1's out";
    const reference::ArNormResult r3 = reference::program_norm(qb, r1.residual_out, gammas[1], eps, d, ctas);
    EXPECT_TRUE(x2b == r3.out) << "op 3's out";
    EXPECT_TRUE(hb == r3.residual_out) << "the residual stream after op 3";
    EXPECT_TRUE(x3b == reference::program_norm(xin, {}, gammas[2], eps, kin, ctas).out) << "op 5's out";
    EXPECT_TRUE(bits[9] == xin) << "op 5's residual_out (x itself without a residual)";
    EXPECT_TRUE(xab == reference::program_norm(host_window(p, m, d, 0, 1024), {}, gammas[3], eps, 1024, ctas).out)
        << "op 6's out";
    EXPECT_TRUE(xbb == reference::program_norm(host_window(p, m, d, 1024, 512), {}, gammas[4], eps, 512, ctas).out)
        << "op 7's out";
    check_op(x0, k0, w0, pb_, d, m);
    check_op(x1b, d, w2, qb, d, m);
    check_op(x2b, d, w4, sb, n4, m);
  }
}

// A program that records its timeline gives the same bits as one that does not,
// and each of its last runs has, for every CTA, its SM and per op of its units a
// start, an MMA end and an epilogue end in that order (runs beyond 8 keep the last 8).
TEST(GemmProgram, TimelineKeepsTheBitsAndOrdersEachOpsTimes) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  Chain c(3, {1536, 2112, 1536, 4608}, false, rng);
  GemmProgram plain(c.ops(), 3);
  GemmProgram traced(c.ops(), 3, true);
  EXPECT_TRUE(plain.timelines().empty());
  EXPECT_TRUE(traced.timelines().empty()) << "no run yet";
  c.fresh(rng);
  const auto bits = c.checked_run(plain, nullptr);
  for (int run = 0; run < 10; ++run) {
    for (std::size_t i = 0; i < c.gemms.size(); ++i) poison(c.out(i));
    traced.run(nullptr);
  }
  TPD_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(c.bits() == bits) << "the traced program's bits differ";
  expect_timelines(traced, 8);
}

TEST(GemmProgram, Refusals) {
  TPD_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  Chain c(4, {256, 512, 256}, false, rng);
  EXPECT_THROW(GemmProgram(c.ops(), 0), InvalidArgument);
  EXPECT_THROW(GemmProgram(c.ops(), 65), InvalidArgument);
  EXPECT_THROW(GemmProgram({}, 4), InvalidArgument);
  auto bad = c.gemms;
  bad[1].after = 1;  // itself
  EXPECT_THROW(GemmProgram({bad.begin(), bad.end()}, 4), InvalidArgument);
  bad = c.gemms;
  bad[0].after = 1;  // a later op
  EXPECT_THROW(GemmProgram({bad.begin(), bad.end()}, 4), InvalidArgument);
  bad = c.gemms;
  bad[1].x = TensorView::bf16(c.acts[1].get(), 4, 256);  // K of op 1 is 512
  EXPECT_THROW(GemmProgram({bad.begin(), bad.end()}, 4), InvalidArgument);
  bad = c.gemms;
  bad[1].after = -1;  // op 1 reads op 0's out without waiting for it
  EXPECT_THROW(GemmProgram({bad.begin(), bad.end()}, 4), InvalidArgument);
  bad = c.gemms;
  bad[0].x.dtype = DType::kF32;
  EXPECT_THROW(GemmProgram({bad.begin(), bad.end()}, 4), InvalidArgument);
  bad = c.gemms;
  bad[0].epilogue = GemmProgram::Epilogue::kSiluMul;  // out [4, 512] where silu(gate) * up is [4, 256]
  EXPECT_THROW(GemmProgram({bad.begin(), bad.end()}, 4), InvalidArgument);
  bad = c.gemms;
  bad[0].epilogue = GemmProgram::Epilogue::kSiluMul;  // 511 rows: no gate for every up
  bad[0].weight = TensorView::bf16(c.weights[0].get(), 511, 256);
  bad[0].out.cols = 255;
  EXPECT_THROW(GemmProgram({bad.begin(), bad.end()}, 4), InvalidArgument);
  bad = c.gemms;
  bad[1].epilogue = static_cast<GemmProgram::Epilogue>(7);
  EXPECT_THROW(GemmProgram({bad.begin(), bad.end()}, 4), InvalidArgument);
  // Norms: a residual of the wrong width; a weight of the wrong width; k not a
  // multiple of 8; an out over its residual_out; a negative eps (InvalidArgument);
  // columns beyond what a CTA's finisher holds (Unavailable).
  DeviceBuffer nx(4 * 4096 * 2), nw(4096 * 2), nout(4 * 4096 * 2), nres(4 * 4096 * 2);
  auto nv = [](DeviceBuffer& b, int64_t rows, int64_t cols) { return TensorView::bf16(b.get(), rows, cols); };
  const GemmProgram::Norm good{nv(nx, 4, 256), -1, nv(nw, 1, 256), 1e-6f, nv(nres, 4, 256), {}, nv(nout, 4, 256)};
  EXPECT_NO_THROW(GemmProgram({good}, 4));
  const std::vector<std::function<void(GemmProgram::Norm&)>> breaks = {
      [&](GemmProgram::Norm& n) { n.residual = nv(nres, 4, 248); },
      [&](GemmProgram::Norm& n) { n.weight = nv(nw, 1, 248); },
      [&](GemmProgram::Norm& n) {
        n.x = nv(nx, 4, 252);
        n.weight = nv(nw, 1, 252);
        n.residual = nv(nres, 4, 252);
        n.out = nv(nout, 4, 252);
      },
      [&](GemmProgram::Norm& n) { n.residual_out = nv(nout, 4, 256); },
      [&](GemmProgram::Norm& n) { n.eps = -1.0f; },
  };
  for (std::size_t i = 0; i < breaks.size(); ++i) {
    GemmProgram::Norm bad_norm = good;
    breaks[i](bad_norm);
    EXPECT_THROW(GemmProgram({bad_norm}, 4), InvalidArgument) << "norm refusal " << i;
  }
  DeviceBuffer wide(64 * 131072 * 2), wide_w(131072 * 2), wide_out(64 * 131072 * 2);
  EXPECT_THROW(GemmProgram({GemmProgram::Norm{nv(wide, 64, 131072), -1, nv(wide_w, 1, 131072), 1e-6f, {}, {},
                                              nv(wide_out, 64, 131072)}},
                           64),
               Unavailable);  // a limit of the program, not a bad op
  bad = c.gemms;
  bad[0].weight = TensorView::bf16(c.weights[0].get(), 512, 200);  // K not a multiple of 64
  EXPECT_THROW(GemmProgram({bad.begin(), bad.end()}, 4), InvalidArgument);
  bad = c.gemms;
  bad[0].x.data = static_cast<char*>(bad[0].x.data) + 2;  // misaligned
  EXPECT_THROW(GemmProgram({bad.begin(), bad.end()}, 4), InvalidArgument);
}

}  // namespace
}  // namespace tpdecode
