#include "drafter/gpu_drafter.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/streams.hpp"
#include "drafter/gpu_rank.hpp"
#include "drafter/gpu_step_ops.hpp"
#include "drafter/kernels_launch.hpp"
#include "drafter/program_segments.hpp"
#include "drafter/weights.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::drafter {

const char* path_name(DrafterPath p) {
  return p == DrafterPath::kStock ? "stock" : p == DrafterPath::kSpecialised ? "specialised" : "program";
}

const char* form_name(ProgramForm f) { return f == ProgramForm::kPrograms ? "programs" : "launches"; }

namespace {

bool is_linear(Tensor t) {
  return t == Tensor::kQkvA || t == Tensor::kQB || t == Tensor::kOProj || t == Tensor::kGateUp ||
         t == Tensor::kDown || t == Tensor::kContextProj || t == Tensor::kLmHead;
}

int64_t round16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

}  // namespace

GpuDrafter::GpuDrafter(Team& team, const DrafterConfig& config, int rows_cap, const Progress& progress)
    : team_(team),
      config_(config),
      shapes_(rank_shapes(config, team.size())),
      rows_cap_(rows_cap),
      shared_gpu_(team.kind() == TeamKind::kLocal && team.size() > 1) {
  require(rows_cap >= 1 && rows_cap <= 64, fmt::format("drafter: rows_cap {} (1 .. 64)", rows_cap));
  require(ar_norm_hidden_served(config.hidden),
          fmt::format("drafter: hidden {} (the norm kernels take multiples of 64 up to 16384)", config.hidden));
  const std::vector<WeightId> ids = all_weights(config);
  const std::vector<int32_t> tokens = step_tokens(config, rows_cap);
  for (int i = 0; i < team.driven(); ++i) {
    auto r = std::make_unique<GpuRank>();
    r->driven = i;
    r->rank = team.rank(i);
    r->device = team.device(i);
    r->stream = team.stream(i);
    TPD_CUDA(cudaSetDevice(r->device));
    const cudaStream_t s = r->stream;
    std::size_t bytes = 0;
    for (const WeightId& id : ids) {
      const FillSpec f = weight_fill(config, id, team.size(), r->rank);
      DeviceBuffer mem(static_cast<std::size_t>(f.map.rows * f.map.cols) * 2);
      launch_fill(s, mem.get(), f);
      r->weights[id.key()] = TensorView::bf16(mem.get(), f.map.rows, f.map.cols);
      if (id.tensor == Tensor::kEmbedding) r->vocab0 = f.map.row0;
      bytes += static_cast<std::size_t>(f.map.rows * f.map.cols) * 2;
      r->weight_memory[id.key()] = std::move(mem);
    }
    for (int b = 0; b < static_cast<int>(Buf::kCount); ++b) {
      const int64_t cols = buffer_cols(config, shapes_, static_cast<Buf>(b));
      r->buffer_cols[static_cast<std::size_t>(b)] = cols;
      r->buffers[static_cast<std::size_t>(b)] = DeviceBuffer(static_cast<std::size_t>(rows_cap * cols) * 2);
      TPD_CUDA(cudaMemsetAsync(r->buffers[static_cast<std::size_t>(b)].get(), 0,
                               static_cast<std::size_t>(rows_cap * cols) * 2, s));
    }
    const FillSpec context = context_fill(config, rows_cap);
    launch_fill(s, r->buffers[static_cast<std::size_t>(Buf::kContextIn)].get(), context);
    r->tokens_in = DeviceBuffer(tokens.size() * sizeof(int32_t));
    TPD_CUDA(cudaMemcpyAsync(r->tokens_in.get(), tokens.data(), tokens.size() * sizeof(int32_t),
                             cudaMemcpyHostToDevice, s));
    r->tokens_out = DeviceBuffer(tokens.size() * sizeof(int32_t));
    r->cublas = std::make_shared<CublasContext>();
    for (const WeightId& id : ids)
      if (is_linear(id.tensor)) {
        auto g = std::make_unique<DecodeGemm>(r->weight(id), r->cublas);
        // Why: fused_qkv_a is replicated; every rank must run the same path for the
        // same shape, or the ranks' outputs (and the draft tokens) could differ.
        g->set_agreement(team.gemm_agreement());
        g->set_sharing(team.ranks_sharing_gpu());
        r->gemms[id.key()] = std::move(g);
      }
    TPD_CUDA(cudaStreamSynchronize(s));  // the host token copy must land before `tokens` goes
    weight_bytes_ += bytes;
    if (progress)
      progress(fmt::format("rank {} of {}: {} weight tensors, {:.2f} GB", r->rank, team.size(), ids.size(),
                           static_cast<double>(bytes) / 1e9));
    ranks_.push_back(std::move(r));
  }
  CommConfig cc;
  cc.hidden = config.hidden;
  cc.rows_cap = rows_cap;
  // Why: the widest gathered row is the logits' (TP · vocabulary shard = vocab).
  cc.gather_row_bytes = round16(std::max(config.hidden, config.vocab) * 2);
  comm_ = std::make_unique<TpComm>(team, cc);
  if (team.size() > 1 && team.shares_memory()) {
    auto box = std::make_shared<OprojMailbox>(team, rows_cap, config.hidden);
    OprojOptions o;
    for (const auto& r : ranks_) o.cublas.push_back(r->cublas);
    for (int l = 0; l < config.layers; ++l) {
      std::vector<TensorView> weights;
      for (const auto& r : ranks_) weights.push_back(r->weight({Tensor::kOProj, l}));
      oprojs_.push_back(std::make_unique<PreparedOproj>(*comm_, box, weights, OprojEpilogue::kArNorm, o));
    }
  }
}

GpuDrafter::~GpuDrafter() = default;

void GpuDrafter::prepare(int m) {
  require(m >= 1 && m <= rows_cap_, fmt::format("drafter: {} rows (1 .. {})", m, rows_cap_));
  for (const auto& r : ranks_) {
    TPD_CUDA(cudaSetDevice(r->device));
    for (auto& [key, g] : r->gemms) g->prepare(m, r->stream);
  }
  for (auto& op : oprojs_) op->prepare(m);
  if (serves_programs() && program_form(m) == ProgramForm::kPrograms && !programs_.count(m)) build_programs(m);
}

// Records the step's segments (the launches of the other ops go nowhere) and builds
// a TeamProgram per segment: every driven rank's ops on its buffers and weights.
void GpuDrafter::build_programs(int m) {
  class Nothing final : public StepOps {
   public:
    void embed(const Slice&) override {}
    void gemm(WeightId, const Slice&, const Slice&) override {}
    void ar_norm(const Slice&, bool, WeightId, const Slice&) override {}
    void rms_norms(std::span<const RowNorm>) override {}
    void attention(const Slice&, const Slice&, const Slice&, const Slice&) override {}
    void silu_mul(const Slice&, const Slice&) override {}
    void gather(GatherKind, const Slice&, const Slice&) override {}
    void add(const Slice&, const Slice&, const Slice&) override {}
    void argmax(const Slice&) override {}
  } nothing;
  TPD_CUDA(cudaSetDevice(ranks_.at(0)->device));
  Programs built;
  // Rank r's ops of a segment.
  auto rank_ops = [&](const GpuRank& r, const Segment& segment) {
    std::vector<GemmProgram::Op> ops;
    std::vector<TensorView> outs;  // per op: where the program writes its out
    for (const SegmentOp& s : segment) {
      TensorView out = r.view(s.out, m);
      if (s.out_private && !s.folded) {  // the buffer's layout, memory of its own (a folded norm writes none)
        const int64_t cols = r.buffer_cols[static_cast<std::size_t>(s.out.buf)];
        built.buffers.emplace_back(static_cast<std::size_t>(m * cols) * 2);
        out.data = static_cast<uint16_t*>(built.buffers.back().get()) + s.out.col0;
      }
      TensorView x = r.view(s.x, m);
      if (s.after >= 0) {  // the same window of the out it reads (which may be private)
        const SegmentOp& from = segment[static_cast<std::size_t>(s.after)];
        x.data = static_cast<uint16_t*>(outs[static_cast<std::size_t>(s.after)].data) + (s.x.col0 - from.out.col0);
      }
      outs.push_back(out);
      if (!s.norm) {
        ops.push_back(GemmProgram::Gemm{r.weight(s.weight), x, out, s.after,
                                        s.silu_mul ? GemmProgram::Epilogue::kSiluMul : GemmProgram::Epilogue::kPlain});
        continue;
      }
      const TensorView residual = r.view({Buf::kResidual, 0, config_.hidden}, m);
      GemmProgram::Norm norm{x, s.after, r.weight(s.weight), config_.eps, s.residual ? residual : TensorView{},
                             s.residual_out ? residual : TensorView{}, out, s.folded};
      norm.all_reduce = s.all_reduce;
      ops.push_back(norm);
    }
    return ops;
  };
  run_segmented_step(config_, shapes_, nothing, [&](int, const Segment& segment) {
    std::vector<std::vector<GemmProgram::Op>> ops;
    for (const auto& r : ranks_) ops.push_back(rank_ops(*r, segment));
    built.programs.push_back(std::make_unique<TeamProgram>(team_, std::move(ops), m));
  });
  programs_[m] = std::move(built);
}

void GpuDrafter::set_oproj_kind(std::optional<OprojKind> kind) {
  for (auto& op : oprojs_) op->set_kind(kind);
}

void GpuDrafter::enqueue_step(DrafterPath path, int m, const OpFilter& filter) {
  require(m >= 1 && m <= rows_cap_, fmt::format("drafter: {} rows (1 .. {})", m, rows_cap_));
  const auto built = programs_.find(m);
  const bool programs = path == DrafterPath::kProgram && program_form(m) == ProgramForm::kPrograms;
  if (path == DrafterPath::kProgram) {
    require(serves_programs(), "drafter: the program path runs at TP 1 or on ranks that share memory");
    require(filter.gemm && filter.collective && filter.other, "drafter: the program path runs whole steps only");
    require(!programs || built != programs_.end(),
            fmt::format("drafter: the program path for {} rows needs prepare({})", m, m));
  }
  std::vector<cudaStream_t> others;
  for (std::size_t i = 1; i < ranks_.size(); ++i) others.push_back(ranks_[i]->stream);
  fork_streams(stream(), others);
  comm_->set_algorithm(path == DrafterPath::kStock ? CommAlgorithm::kStock : CommAlgorithm::kAuto);
  const DrafterPath launches = path == DrafterPath::kProgram ? DrafterPath::kSpecialised : path;
  GpuStepOps ops(config_, shapes_, ranks_, *comm_, oprojs_, launches, m, shared_gpu_);
  if (programs) {
    run_segmented_step(config_, shapes_, ops, [&](int index, const Segment&) {
      built->second.programs.at(static_cast<std::size_t>(index))->run();  // every rank's stream
    });
  } else {
    run_step(config_, shapes_, ops, filter);
  }
  join_streams(stream(), others);
  comm_paths_ = ops.comm_paths();
}

cudaStream_t GpuDrafter::stream() const { return ranks_.at(0)->stream; }

std::vector<uint16_t> GpuDrafter::logits(int driven, int m) const {
  const GpuRank& r = *ranks_.at(static_cast<std::size_t>(driven));
  TPD_CUDA(cudaSetDevice(r.device));
  TPD_CUDA(cudaStreamSynchronize(stream()));
  team_.check_errors();
  std::vector<uint16_t> out(static_cast<std::size_t>(m * config_.vocab));
  TPD_CUDA(cudaMemcpy(out.data(), r.buffers[static_cast<std::size_t>(Buf::kLogits)].get(), out.size() * 2,
                      cudaMemcpyDeviceToHost));
  return out;
}

std::vector<int32_t> GpuDrafter::tokens(int driven, int m) const {
  const GpuRank& r = *ranks_.at(static_cast<std::size_t>(driven));
  TPD_CUDA(cudaSetDevice(r.device));
  TPD_CUDA(cudaStreamSynchronize(stream()));
  team_.check_errors();
  std::vector<int32_t> out(static_cast<std::size_t>(m));
  TPD_CUDA(cudaMemcpy(out.data(), r.tokens_out.get(), out.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace tpdecode::drafter
