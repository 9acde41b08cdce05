// PreparedOproj and OprojMailbox: argument checks, the choice of kind
// (oproj_rules.hpp), preparation and the launches.
#include <array>
#include <optional>
#include <type_traits>

#include "comm/mailbox.hpp"
#include "core/check.hpp"
#include "core/relaxed_capture_mode.hpp"
#include "gemm/gemm_paths.hpp"
#include "oproj/oproj_kernels.hpp"
#include "oproj/oproj_rules.hpp"
#include "team/rank_streams.hpp"
#include "team/team_internals.hpp"
#include "tpdecode/decode_gemm.hpp"
#include "tpdecode/device_buffer.hpp"
#include "tpdecode/oproj.hpp"

namespace tpdecode {

class OprojMailbox::Impl {
 public:
  Team& team;
  // Teams that share memory: the one-shot mailbox and, where H / 8 fragments split
  // over the TP owners, the two-shot pair (one epoch counter for both halves).
  std::optional<Mailbox> box;     // [2, TP, rows_cap, hidden] bf16
  std::optional<Mailbox> recv;    // [2, TP, rows_cap, hidden / TP] bf16
  std::optional<Mailbox> gather;  // [2, 1, rows_cap, hidden] bf16
};

OprojMailbox::OprojMailbox(Team& team, int rows_cap, int64_t hidden) : rows_cap_(rows_cap), hidden_(hidden) {
  check(rows_cap >= 1 && rows_cap <= kOprojMaxRows, "oproj mailbox: rows_cap {} (1 .. {})", rows_cap, kOprojMaxRows);
  check(hidden >= 8 && hidden % 8 == 0, "oproj mailbox: hidden {} (a positive multiple of 8)", hidden);
  impl_ = std::make_unique<Impl>(Impl{team, std::nullopt, std::nullopt, std::nullopt});
  if (team.size() < 2 || !team.shares_memory()) return;
  impl_->box.emplace(team, "o-projection", 2, team.size(), rows_cap, hidden * 2);
  if (hidden % (8 * team.size()) == 0) {
    impl_->recv.emplace(team, "o-projection two-shot", 2, team.size(), rows_cap, hidden / team.size() * 2);
    impl_->gather.emplace(team, "o-projection two-shot gather", 2, 1, rows_cap, hidden * 2, *impl_->recv);
  }
}

OprojMailbox::~OprojMailbox() = default;

namespace {

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TPD_CUDA(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

bool any_capturing(const Team& team) {
  for (int i = 0; i < team.driven(); ++i)
    if (capturing(team.stream(i))) return true;
  return false;
}

// One driven rank's weight and the unfused path's GEMM and scratch rows.
struct RankState {
  TensorView weight;                // [H, K]
  std::unique_ptr<DecodeGemm> gemm;  // the unfused path
  DeviceBuffer partial;             // [rows_cap, H] bf16: the unfused GEMM's output
  DeviceBuffer reduced;             // [rows_cap, H] bf16: the unfused AttnRes path's all-reduce
};

ArNormTail ar_norm_tail(const OprojArNormIo& io) {
  return {io.residual.data, io.weight.data, io.out.data, io.residual_out.data, io.eps};
}

AttnResTail attn_res_tail(const OprojAttnResIo& io) {
  const int64_t m = io.x.rows;
  AttnResTail t{};
  t.partial = io.partial.data;
  t.partial_out = io.partial_out.data;
  t.blocks = io.blocks.data;
  t.block_stride = static_cast<long>(m * io.partial_out.cols);
  t.nb = static_cast<int>(io.blocks.rows / m);
  t.new_block = io.new_block;
  t.key_norm = io.key_norm.data;
  t.query = io.query.data;
  t.out_norm = io.out_norm.data;
  t.eps = io.eps;
  t.out = io.out.data;
  if (io.ahead) {
    t.next_key_norm = io.ahead->key_norm.data;
    t.next_query = io.ahead->query.data;
    t.next_eps = io.ahead->eps;
    t.stats = io.ahead->stats.as<float>();
    t.mixture = io.ahead->mixture.as<float>();
  }
  return t;
}

}  // namespace

class PreparedOproj::Impl {
 public:
  Impl(TpComm& comm, std::shared_ptr<OprojMailbox> mailbox, std::span<const TensorView> weights, OprojEpilogue e,
       const OprojOptions& o)
      : comm_(comm), team_(comm.team()), mailbox_(std::move(mailbox)), kind_(o.kind) {
    check(mailbox_ != nullptr, "oproj: no mailbox");
    check(&boxes().team == &team_, "oproj: the mailbox belongs to another team");
    check(static_cast<int>(weights.size()) == team_.driven(), "oproj: {} weights for {} driven ranks", weights.size(),
          team_.driven());
    check(o.cublas.empty() || static_cast<int>(o.cublas.size()) == team_.driven(),
          "oproj: {} GEMM contexts for {} driven ranks", o.cublas.size(), team_.driven());
    // Why: the driven ranks' GEMMs run at once, and one context's workspace serves one.
    for (std::size_t i = 0; i < o.cublas.size(); ++i)
      for (std::size_t j = i + 1; j < o.cublas.size(); ++j)
        check(!o.cublas[i] || o.cublas[i] != o.cublas[j], "oproj: driven ranks {} and {} were given one GEMM context",
              i, j);
    const TensorView& w0 = weights[0];
    limits_.team = team_.kind();
    limits_.team_size = team_.size();
    limits_.shares_memory = team_.shares_memory() && boxes().box.has_value();
    limits_.hidden = w0.rows;
    limits_.k = w0.cols;
    limits_.rows_cap = mailbox_->rows_cap();
    limits_.epilogue = e;
    check(mailbox_->hidden() >= w0.rows, "oproj: weight rows {} (H) exceed the mailbox rows' {}", w0.rows,
          mailbox_->hidden());
    // Why: the unfused path's all-reduce (+ norm) runs on `comm` (its rows: prepare).
    check(comm.config().hidden >= w0.rows, "oproj: the TpComm holds rows of {} columns, the o-projection's are {}",
          comm.config().hidden, w0.rows);
    check(ar_norm_hidden_served(w0.rows), "oproj: H = {}: the row epilogues take multiples of 64 up to {}", w0.rows,
          kArNormMaxHidden);
    for (int i = 0; i < team_.driven(); ++i) {
      const TensorView& w = weights[static_cast<std::size_t>(i)];
      check(w.dtype == DType::kBF16 && w.rows == w0.rows && w.cols == w0.cols && w.contiguous() && w.aligned(16),
            "oproj: weight of driven rank {} must be bf16 [{}, {}], contiguous, 16-byte aligned ({})", i, w0.rows,
            w0.cols, w.describe());
      TPD_CUDA(cudaSetDevice(team_.device(i)));
      RankState r;
      r.weight = w;
      r.gemm = std::make_unique<DecodeGemm>(w, o.cublas.empty() ? nullptr : o.cublas.at(static_cast<std::size_t>(i)));
      r.gemm->set_agreement(team_.gemm_agreement());
      r.gemm->set_sharing(team_.ranks_sharing_gpu());
      const std::size_t rows_bytes = static_cast<std::size_t>(limits_.rows_cap * w0.rows) * 2;
      r.partial = DeviceBuffer(rows_bytes);
      if (e == OprojEpilogue::kAttnRes) r.reduced = DeviceBuffer(rows_bytes);
      ranks_.push_back(std::move(r));
    }
    if (limits_.team_size > 1 && limits_.shares_memory) {
      TPD_CUDA(cudaSetDevice(team_.device(0)));
      limits_.consumer_rows = oproj_consumer_rows(rank_context(team_, 0), e, limits_.hidden);
      // Why the mailbox's width: the owners' column ranges are the mailbox rows'.
      if (boxes().recv && mailbox_->hidden() == limits_.hidden)
        limits_.two_shot_clusters = oproj_two_shot_clusters(rank_context(team_, 0), e, limits_.hidden);
    }
    for (int m : o.rows) prepare(m);
  }

  const OprojLimits& limits() const { return limits_; }
  void set_kind(std::optional<OprojKind> k) { kind_ = k; }

  void prepare(int m) {
    check(m >= 1 && m <= std::min(limits_.rows_cap, kOprojMaxRows), "oproj: {} rows (1 .. {})", m,
          std::min(limits_.rows_cap, kOprojMaxRows));
    check(!any_capturing(team_), "oproj: prepare() for {} rows under stream capture (prepare before capturing)", m);
    check<TeamBroken>(!team_.broken(), "oproj: prepare() on {}, which is broken; build a new team", team_.describe());
    if (shapes_[static_cast<std::size_t>(m)]) return;
    const RelaxedCaptureMode relaxed;
    OprojShape s;
    s.m = m;
    int sms = 0;
    TPD_CUDA(cudaSetDevice(team_.device(0)));
    TPD_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, team_.device(0)));
    for (int i = 0; i < team_.driven(); ++i) {
      TPD_CUDA(cudaSetDevice(team_.device(i)));
      ranks_[static_cast<std::size_t>(i)].gemm->prepare(m, team_.stream(i));
    }
    TPD_CUDA(cudaSetDevice(team_.device(0)));
    const bool engine = warp_eligible(limits_.hidden, limits_.k);
    if (engine) s.split = producer_split(m, sms);
    if (engine && limits_.team_size > 1 && limits_.shares_memory) {
      const int tiles = warp_token_tiles(m);
      s.fused_ctas = oproj_fused_grid_ctas(limits_.hidden, s.split, m);
      for (int i = 0; i < team_.driven(); ++i) {
        TPD_CUDA(cudaSetDevice(team_.device(i)));
        prepare_oproj_producer(limits_.team_size, tiles);
        if (tiles <= kOprojFusedMaxTiles) prepare_oproj_fused(limits_.team_size, tiles, limits_.epilogue);
      }
      if (tiles <= kOprojFusedMaxTiles) {
        TPD_CUDA(cudaSetDevice(team_.device(0)));
        s.fused_budget = oproj_fused_budget(rank_context(team_, 0), limits_.epilogue, tiles);
      }
    }
    shapes_[static_cast<std::size_t>(m)] = s;
    if (plan(m).kind == OprojKind::kUnfused) require_unfused_rows(m);
  }

  bool prepared(int m) const { return m >= 1 && m <= kOprojMaxRows && shapes_[static_cast<std::size_t>(m)]; }

  const OprojShape& shape(int m) const {
    check(prepared(m), "oproj: {} rows are not prepared", m);
    return *shapes_[static_cast<std::size_t>(m)];
  }

  OprojResult plan(int m) const { return choose_oproj(limits_, shape(m), kind_, oproj_rule_table()); }

  template <class Io>
  OprojResult run(std::span<const Io> io, std::span<const cudaStream_t> streams, OprojEpilogue e) {
    check(e == limits_.epilogue, "oproj: a {} call on a PreparedOproj built for {}", oproj_epilogue_name(e),
          oproj_epilogue_name(limits_.epilogue));
    check(static_cast<int>(io.size()) == team_.driven() && static_cast<int>(streams.size()) == team_.driven(),
          "oproj: {} argument sets and {} streams for {} driven ranks", io.size(), streams.size(), team_.driven());
    check_distinct_streams(streams, "oproj");
    for (const Io& a : io) check_oproj_io(a, limits_.hidden, limits_.k);
    const int m = static_cast<int>(io[0].x.rows);
    for (const Io& a : io) check(a.x.rows == m, "oproj: driven ranks' calls have different row counts");
    team_.check_errors();  // before a prepare, which agrees with the team (TeamBroken where it is broken)
    if (!prepared(m)) {
      // Why the call's streams too: the caller's, not the team's, may be capturing.
      for (cudaStream_t s : streams)
        check(!capturing(s), "oproj: {} rows, not prepared, under stream capture (prepare before capturing)", m);
      prepare(m);  // throws where a team stream captures
    }
    const OprojResult r = plan(m);
    switch (r.kind) {
      case OprojKind::kUnfused:
        require_unfused_rows(m);  // again: set_kind may have changed the plan since prepare
        unfused(io, streams, m);
        break;
      default:
        for (int i = 0; i < team_.driven(); ++i) {
          const RankContext& ctx = rank_context(team_, i);
          const cudaStream_t stream = streams[static_cast<std::size_t>(i)];
          const OprojParams p = params(i, io[static_cast<std::size_t>(i)], m, r.kind);
          if (r.kind == OprojKind::kFused) {
            launch_oproj_fused(ctx, stream, p);
          } else {
            launch_oproj_producer(ctx, stream, p);
            launch_oproj_consumer(ctx, stream, p, limits_.two_shot_clusters);
          }
        }
        break;
    }
    return r;
  }

 private:
  // Why the unfused GEMM's decision: the tuner timed the warp engine's splits on
  // this weight, and the producer is that engine with another epilogue (its split
  // 3 ran TP 2's 7168 x 6144 in 23.8 us, the rule's split 2 in 28.1). The decision
  // is the team's (gemm_agreement), so every rank runs the same split and kind.
  // Else (not the engine, or its narrow CTAs: the producer's CTA is the wide one)
  // the rule's split among the powers of two (the fused kind's clusters of 8 need
  // a divisor).
  // The unfused kind's all-reduce runs through the TpComm: its rows, or CapacityError
  // (at prepare where the plan is unfused, and before a call's GEMMs are queued).
  void require_unfused_rows(int m) const {
    check<CapacityError>(m <= comm_.config().rows_cap || comm_.config().batch_invariant,
                         "oproj: {} rows run unfused, and the TpComm takes {}", m, comm_.config().rows_cap);
  }

  int producer_split(int m, int sms) const {
    const DecodeGemm& g = *ranks_[0].gemm;
    if (g.prepared(m) && g.decision(m).path == GemmPath::kWarpSplitK && g.decision(m).sub_tiles == kWarpWarps)
      return g.decision(m).split;
    return choose_tactic(limits_.hidden, limits_.k, std::min(m, kWarpCandidateMaxRows), sms, true).split;
  }

  template <class Io>
  OprojParams params(int i, const Io& io, int m, OprojKind kind) const {
    const RankContext& ctx = rank_context(team_, i);
    const RankState& r = ranks_[static_cast<std::size_t>(i)];
    const OprojShape& s = shape(m);
    const OprojMailbox::Impl& mailboxes = boxes();
    OprojParams p{};
    p.team = ctx.team;
    p.box = mailboxes.box->ref(i);
    p.two_shot = kind == OprojKind::kTwoShot;
    if (p.two_shot) {
      p.recv = mailboxes.recv->ref(i);
      p.gather = mailboxes.gather->ref(i);
    }
    p.gemm = WarpSplitKParams{.w = r.weight.data,
                              .x = io.x.data,
                              .out = nullptr,
                              .m = m,
                              .chunks = static_cast<int>(limits_.k / kWarpChunkK),
                              .n = limits_.hidden,
                              .k = limits_.k,
                              .out_stride = 0};
    p.split = s.split;
    p.token_tiles = warp_token_tiles(m);
    p.hidden = static_cast<int>(limits_.hidden);
    p.trigger_early = ctx.ranks_on_device == 1;
    p.system_fence = comm_.config().system_fence;
    p.epilogue = limits_.epilogue;
    if constexpr (std::is_same_v<Io, OprojArNormIo>)
      p.ar_norm = ar_norm_tail(io);
    else
      p.attn_res = attn_res_tail(io);
    return p;
  }

  // The GEMM into the scratch rows, then the collective and its epilogue.
  void unfused(std::span<const OprojArNormIo> io, std::span<const cudaStream_t> streams, int m) {
    std::vector<ArNormIo> norm;
    for (int i = 0; i < team_.driven(); ++i) {
      const OprojArNormIo& a = io[static_cast<std::size_t>(i)];
      const TensorView partial = gemm(i, a.x, streams[static_cast<std::size_t>(i)], m);
      norm.push_back(ArNormIo{partial, a.residual, a.weight, a.eps, a.out, a.residual_out});
    }
    comm_.ar_norm(norm, streams);
  }

  void unfused(std::span<const OprojAttnResIo> io, std::span<const cudaStream_t> streams, int m) {
    std::vector<AllReduceIo> reduce;
    for (int i = 0; i < team_.driven(); ++i) {
      const TensorView partial = gemm(i, io[static_cast<std::size_t>(i)].x, streams[static_cast<std::size_t>(i)], m);
      reduce.push_back({partial, TensorView::bf16(ranks_[static_cast<std::size_t>(i)].reduced.get(), m, limits_.hidden)});
    }
    comm_.all_reduce(reduce, streams);
    for (int i = 0; i < team_.driven(); ++i) {
      TPD_CUDA(cudaSetDevice(team_.device(i)));
      launch_attn_res(streams[static_cast<std::size_t>(i)], rank_context(team_, i).pdl,
                      ranks_[static_cast<std::size_t>(i)].reduced.get(), attn_res_tail(io[static_cast<std::size_t>(i)]),
                      m, static_cast<int>(limits_.hidden));
    }
  }

  TensorView gemm(int i, const TensorView& x, cudaStream_t stream, int m) {
    RankState& r = ranks_[static_cast<std::size_t>(i)];
    TPD_CUDA(cudaSetDevice(team_.device(i)));
    const TensorView partial = TensorView::bf16(r.partial.get(), m, limits_.hidden);
    r.gemm->run(x, partial, stream);
    return partial;
  }

  // The shared mailboxes: OprojMailbox's internals, which only PreparedOproj reads.
  const OprojMailbox::Impl& boxes() const { return *mailbox_->impl_; }

  TpComm& comm_;
  Team& team_;
  std::shared_ptr<OprojMailbox> mailbox_;
  std::optional<OprojKind> kind_;
  OprojLimits limits_;
  std::vector<RankState> ranks_;
  std::array<std::optional<OprojShape>, kOprojMaxRows + 1> shapes_{};
};

PreparedOproj::PreparedOproj(TpComm& comm, std::shared_ptr<OprojMailbox> mailbox, std::span<const TensorView> weights,
                             OprojEpilogue epilogue, const OprojOptions& options)
    : impl_(std::make_unique<Impl>(comm, std::move(mailbox), weights, epilogue, options)) {}

PreparedOproj::~PreparedOproj() = default;

OprojEpilogue PreparedOproj::epilogue() const { return impl_->limits().epilogue; }
int64_t PreparedOproj::hidden() const { return impl_->limits().hidden; }
int64_t PreparedOproj::k() const { return impl_->limits().k; }
void PreparedOproj::set_kind(std::optional<OprojKind> kind) { impl_->set_kind(kind); }
void PreparedOproj::prepare(int m) { impl_->prepare(m); }
bool PreparedOproj::prepared(int m) const { return impl_->prepared(m); }
OprojResult PreparedOproj::plan(int m) const { return impl_->plan(m); }
int PreparedOproj::producer_split(int m) const { return impl_->shape(m).split; }

OprojResult PreparedOproj::run(std::span<const OprojArNormIo> io, std::span<const cudaStream_t> streams) {
  return impl_->run(io, streams, OprojEpilogue::kArNorm);
}

OprojResult PreparedOproj::run(std::span<const OprojAttnResIo> io, std::span<const cudaStream_t> streams) {
  return impl_->run(io, streams, OprojEpilogue::kAttnRes);
}

}  // namespace tpdecode
