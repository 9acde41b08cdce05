// ar_norm's FP8 epilogues (ArNormQuant) on every team this machine has, on every
// path (one-shot, two-shot, stock): the e4m3 output and the group scales bitwise
// equal to the reference quantiser (reference/fp8_quant.hpp) of the same call's
// BF16 output, the new residual unchanged, every rank identical; in a CUDA graph
// replayed back to back with the static scale changed between replays. First the
// device's conversion itself against the reference, on every BF16 value and a
// sweep of FP32 values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "comm/row_quant.cuh"
#include "gpu/comm_cases.hpp"
#include "gpu/gpu_test_util.hpp"
#include "reference/fp8_quant.hpp"
#include "core/bf16.hpp"
#include "tpdecode/comm.hpp"

namespace tpdecode {
namespace {

using test::ArNormCase;
using test::team_streams;

__global__ void e4m3_kernel(const float* in, uint2* out, int groups) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  float v[8];
  for (int j = 0; j < 8; ++j) v[j] = in[8 * g + j];
  out[g] = rowquant::e4m3x8(v);
}

__global__ void group_scale_kernel(const float* amax, float* out, int n, bool ue8m0) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = rowquant::group_scale(amax[i], ue8m0);
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

TEST(Fp8Epilogue, DeviceConversionIsTheReferencesOnEveryBf16AndAFp32Sweep) {
  TPD_REQUIRE_GPU();
  std::vector<float> in;
  for (uint32_t b = 0; b < 0x10000; ++b) in.push_back(bf16::to_float(static_cast<uint16_t>(b)));
  std::mt19937_64 rng(test::fresh_seed());
  for (int i = 0; i < (test::quick() ? 1 << 14 : 1 << 20); ++i) in.push_back(from_bits(static_cast<uint32_t>(rng())));
  for (int b = 0; b < 0x7e; ++b) {  // every midpoint of two e4m3 neighbours and its FP32 neighbours
    const float mid = (reference::float_from_e4m3(static_cast<uint8_t>(b)) +
                       reference::float_from_e4m3(static_cast<uint8_t>(b + 1))) / 2;
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      in.push_back(x);
      in.push_back(-x);
    }
  }
  while (in.size() % 8) in.push_back(0.0f);
  const int groups = static_cast<int>(in.size() / 8);
  const DeviceBuffer in_dev = test::to_device(in);
  DeviceBuffer out_dev(in.size());
  e4m3_kernel<<<(groups + 255) / 256, 256>>>(in_dev.as<float>(), out_dev.as<uint2>(), groups);
  TPD_CUDA(cudaDeviceSynchronize());
  const std::vector<uint8_t> got = test::to_host<uint8_t>(out_dev, in.size());
  int wrong = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const uint8_t want = reference::e4m3_from_float(in[i]);
    // Why NaN apart: the reference keeps a NaN's sign (NVIDIA's host emulation does);
    // the kernels only ever quantise positive NaNs (a poisoned row's), checked bitwise.
    const bool ok = std::isnan(in[i]) && std::signbit(in[i]) ? (got[i] & 0x7f) == 0x7f : got[i] == want;
    if (!ok && ++wrong <= 10)
      ADD_FAILURE() << "x = " << in[i] << " (bits 0x" << std::hex << bits_of(in[i]) << "): got 0x" << int{got[i]}
                    << ", reference 0x" << int{want};
  }
  EXPECT_EQ(wrong, 0) << "of " << in.size();
}

TEST(Fp8Epilogue, DeviceGroupScalesAreTheReferences) {
  TPD_REQUIRE_GPU();
  std::vector<float> amax = {0.0f, 1e-12f, 1e-10f, 448.0f, 449.0f, 224.0f, 3.0f, std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN()};
  for (int e = -60; e <= 60; ++e) {
    const float p = std::ldexp(448.0f, e);  // scale exactly 2^e
    for (float x : {p, std::nextafter(p, 0.0f), std::nextafter(p, 1e30f)}) amax.push_back(x);
  }
  std::mt19937_64 rng(test::fresh_seed());
  for (int i = 0; i < 100000; ++i) amax.push_back(std::fabs(from_bits(static_cast<uint32_t>(rng()) & 0x7f7fffffu)));
  const DeviceBuffer in = test::to_device(amax);
  DeviceBuffer out(amax.size() * 4);
  for (bool ue8m0 : {false, true}) {
    group_scale_kernel<<<static_cast<unsigned>((amax.size() + 255) / 256), 256>>>(in.as<float>(), out.as<float>(),
                                                                                   static_cast<int>(amax.size()), ue8m0);
    TPD_CUDA(cudaDeviceSynchronize());
    const std::vector<float> got = test::to_host<float>(out, amax.size());
    int wrong = 0;
    for (std::size_t i = 0; i < amax.size(); ++i) {
      const float want = reference::group_scale(amax[i], ue8m0);
      const bool ok = std::isnan(want) ? std::isnan(got[i]) : bits_of(got[i]) == bits_of(want);
      if (!ok && ++wrong <= 10)
        ADD_FAILURE() << "amax " << amax[i] << " ue8m0 " << ue8m0 << ": got " << got[i] << ", reference " << want;
    }
    EXPECT_EQ(wrong, 0);
  }
}

constexpr ArNormQuant kQuants[] = {ArNormQuant::kStatic, ArNormQuant::kGroup, ArNormQuant::kGroupUe8m0};

// One quantised call's outputs on every driven rank, beside an ArNormCase.
struct Fp8Outputs {
  std::vector<DeviceBuffer> q, scales, residual;
  std::vector<ArNormIo> io;

  Fp8Outputs(const Team& team, const ArNormCase& n, ArNormQuant quant, const DeviceBuffer& static_scale) {
    const int64_t groups = n.hidden / kArNormQuantGroup;
    for (int i = 0; i < team.driven(); ++i) {
      const std::size_t k = static_cast<std::size_t>(i);
      q.emplace_back(static_cast<std::size_t>(n.rows * n.hidden));
      scales.emplace_back(static_cast<std::size_t>(n.rows * groups * 4));
      residual.emplace_back(static_cast<std::size_t>(n.rows * n.hidden * 2));
      test::poison(q.back());  // 0xff: an e4m3 NaN; scales: an FP32 NaN
      test::poison(scales.back());
      test::poison(residual.back());
      ArNormIo a = n.io[k];
      a.out = TensorView::e4m3(q.back().get(), n.rows, n.hidden);
      a.residual_out = TensorView::bf16(residual.back().get(), n.rows, n.hidden);
      a.quant = quant;
      a.scale = quant == ArNormQuant::kStatic ? TensorView::f32(const_cast<void*>(static_scale.get()), 1, 1)
                                              : TensorView::f32(scales.back().get(), n.rows, groups);
      io.push_back(a);
    }
    TPD_CUDA(cudaDeviceSynchronize());
  }

  // Driven ranks whose e4m3 output, scales or new residual differ from the
  // reference quantiser of `bf16_out[i]` (the BF16 call's output on the same inputs)
  // and from `residual_want[i]`, or from driven rank 0's.
  int ranks_wrong(const ArNormCase& n, ArNormQuant quant, float scale, const std::vector<std::vector<uint16_t>>& bf16_out,
                  const std::vector<std::vector<uint16_t>>& residual_want) const {
    const std::size_t size = static_cast<std::size_t>(n.rows * n.hidden);
    int wrong = 0;
    std::vector<uint8_t> first;
    for (std::size_t i = 0; i < q.size(); ++i) {
      const std::vector<uint8_t> got = test::to_host<uint8_t>(q[i], size);
      bool ok = test::to_host<uint16_t>(residual[i], size) == residual_want[i];
      if (quant == ArNormQuant::kStatic) {
        ok = ok && got == reference::quantise_static(bf16_out[i], scale);
      } else {
        const reference::GroupQuant want =
            reference::quantise_groups(bf16_out[i], n.hidden, quant == ArNormQuant::kGroupUe8m0);
        const std::vector<float> got_scales = test::to_host<float>(scales[i], want.scales.size());
        ok = ok && got == want.q && std::memcmp(got_scales.data(), want.scales.data(), want.scales.size() * 4) == 0;
      }
      if (i == 0) first = got;
      wrong += !ok || got != first;
    }
    return wrong;
  }
};

std::vector<int64_t> fp8_hidden_sizes() {
  if (test::quick()) return {7168};
  return {2048, 5120, 7168, 16384};
}
std::vector<int> fp8_rows() {
  if (test::quick()) return {1, 9};
  return {1, 5, 17, 64};
}

TEST(Fp8Epilogue, ArNormFp8IsTheReferenceQuantiserOfItsBf16OutputOnEveryPath) {
  TPD_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  test::for_each_team([&](Team& team) {
    const std::vector<cudaStream_t> streams = team_streams(team);
    for (int64_t hidden : fp8_hidden_sizes()) {
      CommConfig cc;
      cc.hidden = hidden;
      TpComm comm(team, cc);
      for (int rows : fp8_rows()) {
        ArNormCase n(team, rows, hidden, rows % 2 == 1, seed + static_cast<uint64_t>(hidden * 131 + rows));
        // A scale that saturates the largest outputs (|v| up to ~4) and leaves subnormals.
        const float scale = 0.006f + 0.001f * static_cast<float>(rows % 3);
        const DeviceBuffer static_scale = test::to_device(std::vector<float>{scale});
        for (CommAlgorithm algorithm : {CommAlgorithm::kOneShot, CommAlgorithm::kTwoShot, CommAlgorithm::kStock}) {
          comm.set_algorithm(algorithm);
          const CommResult r = comm.ar_norm(n.io, streams);
          if (algorithm != CommAlgorithm::kStock && r.path == CommPath::kStock) continue;  // not served here
          SCOPED_TRACE(testing::Message() << "TP " << team.size() << " hidden " << hidden << " rows " << rows << " "
                                          << comm_path_name(r.path));
          team.synchronize();
          ASSERT_EQ(n.ranks_wrong(team), 0) << "the BF16 call";
          std::vector<std::vector<uint16_t>> bf16_out, residual;
          for (std::size_t i = 0; i < n.out.size(); ++i) {
            bf16_out.push_back(test::to_host<uint16_t>(n.out[i], n.reference.out.size()));
            residual.push_back(test::to_host<uint16_t>(n.res_out[i], n.reference.out.size()));
          }
          for (ArNormQuant quant : kQuants) {
            Fp8Outputs f(team, n, quant, static_scale);
            EXPECT_EQ(comm.ar_norm(f.io, streams).path, r.path) << ar_norm_quant_name(quant);
            team.synchronize();
            EXPECT_EQ(f.ranks_wrong(n, quant, scale, bf16_out, residual), 0) << ar_norm_quant_name(quant);
          }
        }
      }
    }
  });
}

// A graph of a BF16 call and the three FP8 calls, replayed back to back: every
// replay's outputs checked inside the graph. Then the static scale changed between
// replays: the replay reads the new one.
TEST(Fp8Epilogue, GraphReplaysReadTheStaticScaleEachTime) {
  TPD_REQUIRE_GPU();
  const int replays = test::quick() ? 50 : 1000;
  const uint64_t seed = test::fresh_seed();
  test::for_each_team([&](Team& team) {
    const std::vector<cudaStream_t> streams = team_streams(team);
    TpComm comm(team);  // hidden 7168
    ArNormCase n(team, 3, 7168, true, seed);
    DeviceBuffer static_scale = test::to_device(std::vector<float>{0.01f});
    comm.ar_norm(n.io, streams);
    team.synchronize();
    std::vector<std::vector<uint16_t>> bf16_out, residual;
    for (std::size_t i = 0; i < n.out.size(); ++i) {
      bf16_out.push_back(test::to_host<uint16_t>(n.out[i], n.reference.out.size()));
      residual.push_back(test::to_host<uint16_t>(n.res_out[i], n.reference.out.size()));
    }
    std::vector<Fp8Outputs> runs;
    for (ArNormQuant quant : kQuants) runs.emplace_back(team, n, quant, static_scale);
    test::TeamGraph graph(team, [&] {
      comm.ar_norm(n.io, streams);
      for (const Fp8Outputs& f : runs) comm.ar_norm(f.io, streams);
    });
    graph.replay(replays);
    team.synchronize();
    for (std::size_t k = 0; k < runs.size(); ++k)
      EXPECT_EQ(runs[k].ranks_wrong(n, kQuants[k], 0.01f, bf16_out, residual), 0) << ar_norm_quant_name(kQuants[k]);
    test::upload(static_scale, std::vector<float>{0.003f}.data(), 4);
    graph.replay(1);
    team.synchronize();
    EXPECT_EQ(runs[0].ranks_wrong(n, ArNormQuant::kStatic, 0.003f, bf16_out, residual), 0) << "the new scale";
  });
}

}  // namespace
}  // namespace tpdecode
