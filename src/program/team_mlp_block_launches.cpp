#include "program/team_mlp_block_launches.hpp"

#include <fmt/format.h>

#include "comm/rules.hpp"
#include "core/check.hpp"
#include "core/silu_mul_launch.hpp"
#include "team/rank_streams.hpp"
#include "team/team_internals.hpp"

namespace tpdecode::program {

TeamMlpBlockLaunches::TeamMlpBlockLaunches(Team& team, std::span<const TeamMlpBlock::Weights> weights,
                                           std::span<const TeamMlpBlock::Buffers> buffers,
                                           std::span<const MlpBlockScratch> scratch, int m, int comm_group) {
  // Why here: at run() the o-projections would be queued before the norm refused.
  for (std::size_t i = 0; i < weights.size(); ++i)
    for (bool post : {true, false}) try {
        check_ar_norm(norm_io(weights[i], buffers[i], scratch[i], post));
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(fmt::format("team mlp block, the launch form (driven rank {}, {} norm): {}", i,
                                          post ? "post" : "next", e.what()));
      }
  CommConfig config;
  config.hidden = buffers[0].residual.cols;
  config.rows_cap = m;
  comm_ = &shared_comm(team, config, comm_group);  // one for the team's blocks of this H, m and group
  // The weights may still be written on the caller's streams.
  TPD_CUDA(cudaDeviceSynchronize());
  for (std::size_t i = 0; i < weights.size(); ++i) {
    Rank r;
    r.w = weights[i];
    r.b = buffers[i];
    r.s = scratch[i];
    r.gate_up_out = DeviceBuffer(static_cast<std::size_t>(m) * static_cast<std::size_t>(r.w.gate_up.rows) * 2);
    r.gate_up_view = TensorView::bf16(r.gate_up_out.get(), m, r.w.gate_up.rows);
    r.cublas = std::make_shared<CublasContext>();
    r.o_proj = mlp_linear(r.w.o_proj, m, r.cublas);
    r.gate_up = mlp_linear(r.w.gate_up, m, r.cublas);
    r.down = mlp_linear(r.w.down, m, r.cublas);
    r.qkv = mlp_linear(r.w.qkv, m, r.cublas);
    // Why not on a shared GPU: co-resident spinning ranks and PDL have timed out
    // there (docs/performance.md, Known issues).
    const RankContext& ctx = rank_context(team, static_cast<int>(i));
    r.pdl = ctx.pdl_on_own_gpu();
    for (const MlpLinear* l : {&r.o_proj, &r.gate_up, &r.down, &r.qkv})
      if (l->gemm) l->gemm->set_pdl(r.pdl);
    // Each GEMM's operands as run() hands them (InvalidArgument here, not in a run).
    if (r.o_proj.gemm) r.o_proj.gemm->path(r.b.attn, r.s.o);
    r.gate_up.gemm->path(r.s.h, r.gate_up_view);
    r.down.gemm->path(r.s.act, r.s.y);
    if (r.qkv.gemm) r.qkv.gemm->path(r.s.h2, r.b.out);
    ranks_.push_back(std::move(r));
    team_streams_.push_back(team.stream(static_cast<int>(i)));
  }
  post_io_ = norm_io(true);
  next_io_ = norm_io(false);
  TPD_CUDA(cudaDeviceSynchronize());
}

TeamMlpBlockLaunches::~TeamMlpBlockLaunches() = default;

ArNormIo TeamMlpBlockLaunches::norm_io(const TeamMlpBlock::Weights& w, const TeamMlpBlock::Buffers& b,
                                       const MlpBlockScratch& s, bool post) {
  ArNormIo a;
  a.x = post ? (w.o_proj.data ? s.o : b.attn) : s.y;
  a.residual = b.residual;
  a.weight = post ? w.post_norm : w.next_norm;
  a.eps = w.eps;
  a.out = post ? s.h : (w.qkv.data ? s.h2 : b.out);
  a.residual_out = b.residual;
  return a;
}

std::vector<ArNormIo> TeamMlpBlockLaunches::norm_io(bool post) const {
  std::vector<ArNormIo> io;
  for (const Rank& r : ranks_) io.push_back(norm_io(r.w, r.b, r.s, post));
  return io;
}

void TeamMlpBlockLaunches::run(std::span<const cudaStream_t> given) const {
  check(given.empty() || given.size() == ranks_.size(), "team mlp block: {} streams for the {} ranks this object drives",
        given.size(), ranks_.size());
  const std::span<const cudaStream_t> streams = given.empty() ? std::span<const cudaStream_t>(team_streams_) : given;
  check_distinct_streams(streams, "team mlp block");  // before the first GEMMs are queued
  check<TeamBroken>(!comm_->team().broken(), "team mlp block: {} is broken; build a new team", comm_->team().describe());
  auto each = [&](auto stage) {
    for (std::size_t i = 0; i < ranks_.size(); ++i) stage(ranks_[i], streams[i]);
  };
  each([](const Rank& r, cudaStream_t s) {
    if (r.o_proj.gemm) r.o_proj.gemm->run(r.b.attn, r.s.o, s);
  });
  comm_->ar_norm(post_io_, streams);
  each([](const Rank& r, cudaStream_t s) {
    r.gate_up.gemm->run(r.s.h, r.gate_up_view, s);
    launch_silu_mul(s, r.gate_up_view, r.s.act, r.pdl);
    r.down.gemm->run(r.s.act, r.s.y, s);
  });
  comm_->ar_norm(next_io_, streams);
  each([](const Rank& r, cudaStream_t s) {
    if (r.qkv.gemm) r.qkv.gemm->run(r.s.h2, r.b.out, s);
  });
}

}  // namespace tpdecode::program
