// GemmProgram's host side: checks, the plan for the device's SMs, the op
// descriptors, mailbox and counters in device memory, the launch.
#include "tpdecode/gemm_program.hpp"

#include <algorithm>
#include <cmath>

#include "core/check.hpp"
#include "gemm/wgmma_launch.hpp"
#include "program/program_launch.hpp"
#include "program/team_binding.hpp"
#include "tpdecode/device_buffer.hpp"

namespace tpdecode {

struct GemmProgram::Impl {
  int device = 0;
  int m = 0;
  int op_count = 0;
  int grid = 0;
  int64_t bytes = 0;
  program::KernelShape shape;
  DeviceBuffer ops, units, cta_begin, counters, scratch, mailbox, timeline;
  std::vector<DeviceBuffer> packed;  // per op
  program::Args args{};
};

namespace {

void require_bf16(const TensorView& t, int64_t rows, int64_t cols, bool contiguous, std::size_t op,
                  const char* what) {
  check(t.dtype == DType::kBF16, "gemm program: op {}'s {} is {} where bf16 is required", op, what,
        dtype_name(t.dtype));
  check(t.data != nullptr, "gemm program: op {}'s {} is null", op, what);
  check(t.rows == rows && t.cols == cols, "gemm program: op {}'s {} is {} where [{}, {}] is required", op, what,
        t.describe(), rows, cols);
  check(t.row_stride >= t.cols, "gemm program: op {}'s {} has row stride {} below its {} columns", op, what,
        t.row_stride, t.cols);
  if (contiguous)
    check(t.contiguous() && t.aligned(16), "gemm program: op {}'s {} must be contiguous and 16-byte aligned ({})",
          op, what, t.describe());
}

template <class T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer d(std::max<std::size_t>(v.size() * sizeof(T), 16));
  if (!v.empty()) TPD_CUDA(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// A folded norm as the program runs it: its producer (the GEMM whose out its x is
// a window of, from `column`) and the GEMMs that read its out, rewired to read the
// producer's out (reader_columns: their windows of the norm's out).
struct Fold {
  int norm = 0;
  int producer = 0;
  int64_t column = 0;
  std::vector<int> readers;
  std::vector<int64_t> reader_columns;
};

// Checks each folded norm's conditions (gemm_program.hpp) and rewires its readers'
// `after` and windows to its producer.
std::vector<Fold> fold_norms(const std::vector<GemmProgram::Op>& ops, const std::vector<program::OpBuffers>& buffers,
                             std::vector<int>& after, std::vector<int64_t>& window) {
  std::vector<Fold> folds;
  const std::size_t count = ops.size();
  for (std::size_t f = 0; f < count; ++f) {
    if (!ops[f].is_norm || !ops[f].norm.folded) continue;
    const GemmProgram::Norm& norm = ops[f].norm;
    const int producer = after[f];
    const auto p = static_cast<std::size_t>(producer);
    check(producer >= 0 && !ops[p].is_norm && ops[p].gemm.epilogue == GemmProgram::Epilogue::kPlain,
          "gemm program: folded norm op {} needs its x from a plain GEMM op's out (it reads {})", f, producer);
    const int64_t n = ops[p].gemm.weight.rows, k = norm.x.cols;
    Fold fold{static_cast<int>(f), producer, window[f], {}, {}};
    static_assert(program::kBlockRows == 64, "folds_window states the block");
    check(GemmProgram::folds_window(fold.column, k, n),
          "gemm program: folded norm op {}'s x, columns [{}, {}) of op {}'s out, must start at a multiple of 64 "
          "and span a multiple of 64 or reach the out's end",
          f, fold.column, fold.column + k, producer);
    const int stream = buffers[f].residual_after;
    check(stream < 0 || ops[static_cast<std::size_t>(stream)].norm.folded,
          "gemm program: folded norm op {}'s residual is norm op {}'s residual_out, which is not folded (a folded "
          "norm's residual is an input or a folded norm's residual_out)",
          f, stream);
    const bool adds = norm.residual.data != nullptr || norm.residual_out.data != nullptr;
    // Why: the producer's epilogue adds the residual at its own columns, to every
    // block it stores; a narrower window would read and write the residual views
    // past their columns.
    check(!adds || (fold.column == 0 && k == n),
          "gemm program: folded norm op {} adds a residual, so its x must be all of op {}'s out (columns [0, {})), "
          "not columns [{}, {})",
          f, producer, n, fold.column, fold.column + k);
    for (std::size_t j = 0; j < count; ++j) {
      if (j == f) continue;
      check(!adds || after[j] != producer,
            "gemm program: op {} reads op {}'s out, which publishes folded norm op {}'s x + residual: no other op "
            "may read it",
            j, producer, f);
      if (after[j] != static_cast<int>(f)) continue;
      check(!ops[j].is_norm, "gemm program: op {} reads folded norm op {}'s out: only GEMMs may", j, f);
      fold.readers.push_back(static_cast<int>(j));
      fold.reader_columns.push_back(window[j]);
      after[j] = producer;
      window[j] += fold.column;
    }
    check(!fold.readers.empty(), "gemm program: folded norm op {} has no GEMM reading its out", f);
    folds.push_back(std::move(fold));
  }
  return folds;
}

}  // namespace

GemmProgram::GemmProgram(std::vector<Op> ops, int m, bool record_timeline)
    : GemmProgram(std::move(ops), m, record_timeline, nullptr) {}

GemmProgram::GemmProgram(std::vector<Op> ops, int m, bool record_timeline, const program::TeamBinding* team)
    : impl_(std::make_unique<Impl>()) {
  check(m >= 1 && m <= kMaxRows, "gemm program: {} rows where 1 to {} are served", m, kMaxRows);
  check(!ops.empty(), "gemm program: no ops");
  Impl& p = *impl_;
  p.m = m;
  p.op_count = static_cast<int>(ops.size());
  std::vector<program::OpShape> shapes;  // as planned: the packed weights' rows
  std::vector<program::OpShape> outs;    // as published: the outs' columns
  std::vector<program::OpBuffers> buffers;
  std::vector<int> after;
  auto matrix = [](const TensorView& t) {
    return t.data == nullptr ? program::Matrix{}
                             : program::Matrix{reinterpret_cast<uintptr_t>(t.data), t.rows, t.cols, t.row_stride};
  };
  auto rows_aligned = [&](const TensorView& t, std::size_t i, const char* what) {
    check(t.aligned(16) && (m == 1 || t.row_stride % 8 == 0),
          "gemm program: op {}'s {} must be 16-byte aligned with rows 16-byte aligned ({})", i, what, t.describe());
  };
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const int reads = ops[i].is_norm ? ops[i].norm.after : ops[i].gemm.after;
    check(reads >= -1 && reads < static_cast<int>(i), "gemm program: op {} reads op {} (an earlier op or -1)", i,
          reads);
    after.push_back(reads);
    if (ops[i].is_norm) {
      const Norm& g = ops[i].norm;
      const int64_t k = g.x.cols;
      check(k > 0 && k % 8 == 0, "gemm program: norm op {}'s x is {} (k a multiple of 8)", i, g.x.describe());
      require_bf16(g.x, m, k, false, i, "x");
      rows_aligned(g.x, i, "x");
      require_bf16(g.weight, 1, k, true, i, "weight");
      require_bf16(g.out, m, k, false, i, "out");
      rows_aligned(g.out, i, "out");
      check(std::isfinite(g.eps) && g.eps >= 0, "gemm program: norm op {}'s eps is {}", i, g.eps);
      check(!g.all_reduce || team != nullptr,
            "gemm program: norm op {} all-reduces its x over a team: build it in a TeamProgram", i);
      check(!g.all_reduce || !g.folded, "gemm program: norm op {} all-reduces its x, so it cannot be folded", i);
      program::OpBuffers b{matrix(g.x), matrix(g.out), g.after};
      b.folded = g.folded;
      if (g.residual.data != nullptr) {
        require_bf16(g.residual, m, k, false, i, "residual");
        rows_aligned(g.residual, i, "residual");
        // An earlier norm's residual_out (the latest that is this view): chained.
        for (std::size_t j = i; j-- > 0 && b.residual_after < 0;)
          if (ops[j].is_norm && ops[j].norm.residual_out.data == g.residual.data &&
              ops[j].norm.residual_out.row_stride == g.residual.row_stride && ops[j].norm.residual_out.cols == k)
            b.residual_after = static_cast<int>(j);
        if (b.residual_after < 0) b.residual = matrix(g.residual);
      }
      if (g.residual_out.data != nullptr) {
        require_bf16(g.residual_out, m, k, false, i, "residual_out");
        rows_aligned(g.residual_out, i, "residual_out");
        b.residual_out = matrix(g.residual_out);
      }
      shapes.push_back({k, k, true, g.folded});
      outs.push_back({k, k, true, g.folded});
      buffers.push_back(b);
      continue;
    }
    const Gemm& g = ops[i].gemm;
    const int64_t n = g.weight.rows, k = g.weight.cols;
    check(n > 0 && k > 0 && k % 64 == 0, "gemm program: op {}'s weight is {} (K must be a multiple of 64)", i,
          g.weight.describe());
    require_bf16(g.weight, n, k, true, i, "weight");
    const bool gated = g.epilogue == Epilogue::kSiluMul;
    check(gated || g.epilogue == Epilogue::kPlain, "gemm program: op {}'s epilogue is not a GemmProgram::Epilogue", i);
    check(!gated || n % 2 == 0, "gemm program: op {}'s SiLU-mul needs gate and up rows (an even N; the weight is {})",
          i, g.weight.describe());
    require_bf16(g.x, m, k, false, i, "x");
    require_bf16(g.out, m, gated ? n / 2 : n, false, i, gated ? "out (silu(gate) * up)" : "out");
    rows_aligned(g.x, i, "x");
    check(reinterpret_cast<uintptr_t>(g.out.data) % 2 == 0, "gemm program: op {}'s out is not 2-byte aligned", i);
    shapes.push_back({program::packed_rows(n, gated), k});
    outs.push_back({gated ? n / 2 : n, k});
    p.bytes += n * k * 2;
    buffers.push_back({matrix(g.x), matrix(g.out), g.after});
  }
  TPD_CUDA(cudaGetDevice(&p.device));
  TPD_CUDA(cudaDeviceGetAttribute(&p.grid, cudaDevAttrMultiProcessorCount, p.device));
  if (team != nullptr) {
    check(team->ctas >= 1 && team->ctas <= p.grid, "gemm program: {} CTAs on a GPU of {} SMs", team->ctas, p.grid);
    p.grid = team->ctas;
  }
  std::vector<int64_t> window = program::check_buffers(buffers);
  const std::vector<Fold> folds = fold_norms(ops, buffers, after, window);
  for (const Fold& f : folds) {
    shapes[static_cast<std::size_t>(f.producer)].row_stats = outs[static_cast<std::size_t>(f.producer)].row_stats =
        true;
  }
  const program::MailboxLayout mailbox = program::mailbox_layout(outs, after, m, p.grid);
  int major = 0;
  TPD_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, p.device));
  check<Unavailable>(major == 9, "gemm program: needs a compute capability 9.x GPU (this one is {}.x)", major);
  // The weights may still be written on the caller's streams.
  TPD_CUDA(cudaDeviceSynchronize());
  program::prepare_program_kernels();
  p.shape = program::kernel_shape(m);
  // At least 5 stages: the activation loaders look ahead by their warps + 1.
  check<Unavailable>(program::resident_ctas_per_sm(p.shape) >= 1 && p.shape.stages >= 5,
                     "gemm program: its kernel does not fit an SM");
  const program::Plan plan = program::plan_program(shapes, p.grid, m, p.shape.depth);
  // A norm's shared memory: its finisher's handoff holds m rows of the CTAs' sums in
  // fours and the row's rstd (program_norm.cuh).
  const bool norms = std::any_of(ops.begin(), ops.end(), [](const Op& o) { return o.is_norm && !o.norm.folded; });
  check<Unavailable>(!norms || (mailbox.stats_stride / 4 + 1) * m <= int64_t{p.shape.tokens} * program::kBlockRows,
                     "gemm program: norm ops serve up to {} SMs (this GPU has {})",
                     (program::kBlockRows - 1) * 4, p.grid);

  const int64_t epoch_words = mailbox.epoch_elements / 2;
  const std::size_t mailbox_bytes = static_cast<std::size_t>(std::max<int64_t>(2 * epoch_words, 4)) * 4;
  p.mailbox = DeviceBuffer(mailbox_bytes);
  TPD_CUDA(cudaMemset(p.mailbox.get(), 0xff, mailbox_bytes));  // both epochs empty
  auto* epochs = static_cast<uint16_t*>(p.mailbox.get());
  std::vector<program::OpDesc> descs(ops.size());
  int64_t team_fragments = 0;
  const std::vector<int64_t> team_window = program::team_windows(ops, &team_fragments);
  // An op that reads folded norm `stream`'s residual stream: where its producer
  // published it, once that op's count is acquired (its epilogues stored
  // residual_out from other CTAs).
  auto read_stream = [&](program::OpDesc& d, int stream) {
    const auto producer = static_cast<std::size_t>(after[static_cast<std::size_t>(stream)]);
    d.residual_mailbox = mailbox.offset[producer];
    d.residual_mailbox_stride = mailbox.stride[producer];
    d.residual_after_op = static_cast<int32_t>(producer);
    descs[producer].count_release = 1;
  };
  for (std::size_t i = 0; i < ops.size(); ++i) {
    program::OpDesc& d = descs[i];
    const int reads = after[i];
    d.k = shapes[i].k;
    d.n = outs[i].n;
    d.out_mailbox = mailbox.offset[i];
    d.out_mailbox_stride = mailbox.stride[i];
    d.after = reads;
    d.blocks = plan.blocks[i];
    d.x_stride = reads < 0 ? 0 : mailbox.stride[static_cast<std::size_t>(reads)];
    d.x_mailbox = reads < 0 ? -1 : mailbox.offset[static_cast<std::size_t>(reads)] + window[i];
    d.stats = mailbox.stats[i];
    d.stats_stride = ops[i].is_norm ? mailbox.stats_stride : program::row_stats_stride(outs[i].n);
    d.residual_mailbox = -1;
    d.residual_after_op = -1;
    d.rstd_stats = -1;
    if (ops[i].is_norm) {
      const Norm& g = ops[i].norm;
      d.norm = g.folded ? 2 : 1;
      if (g.folded) continue;  // its producer's and readers' descriptors do its work
      d.deferred = mailbox.offset[i] < 0 && std::none_of(buffers.begin(), buffers.end(), [&](const auto& b) {
                     return b.residual_after == static_cast<int>(i);
                   });
      d.eps = g.eps;
      d.all_reduce = g.all_reduce ? 1 : 0;
      d.team_fragment = team_window[i];
      d.norm_weight = g.weight.data;
      d.x_input = g.x.data;
      d.x_input_stride = g.x.row_stride;
      const program::OpBuffers& b = buffers[i];
      const int stream = b.residual_after;  // an earlier norm's residual_out, or -1
      if (stream >= 0 && ops[static_cast<std::size_t>(stream)].norm.folded) {
        read_stream(d, stream);
      } else {
        const TensorView* residual = stream >= 0 ? &ops[static_cast<std::size_t>(stream)].norm.residual_out
                                                 : (g.residual.data != nullptr ? &g.residual : nullptr);
        d.residual = residual != nullptr ? residual->data : nullptr;
        d.residual_stride = residual != nullptr ? residual->row_stride : 0;
      }
      d.residual_out = g.residual_out.data;
      d.residual_out_stride = g.residual_out.row_stride;
      d.out = g.out.data;
      d.out_stride = g.out.row_stride;
      continue;
    }
    const Gemm& g = ops[i].gemm;
    const bool gated = g.epilogue == Epilogue::kSiluMul;
    const void* scale = nullptr;  // a folded norm's weight, at this op's window of its out
    for (const Fold& f : folds) {
      const Norm& norm = ops[static_cast<std::size_t>(f.norm)].norm;
      if (f.producer == static_cast<int>(i)) {  // x's producer: h, its row sums
        const int stream = buffers[static_cast<std::size_t>(f.norm)].residual_after;
        if (stream >= 0) {
          read_stream(d, stream);
        } else if (norm.residual.data != nullptr) {
          d.residual = norm.residual.data;
          d.residual_stride = norm.residual.row_stride;
        }
        d.residual_out = norm.residual_out.data;
        d.residual_out_stride = norm.residual_out.row_stride;
      }
      const auto reader = std::find(f.readers.begin(), f.readers.end(), static_cast<int>(i));
      if (reader == f.readers.end()) continue;
      const int64_t column = f.reader_columns[static_cast<std::size_t>(reader - f.readers.begin())];
      scale = static_cast<const uint16_t*>(norm.weight.data) + column;
      d.rstd_stats = mailbox.stats[static_cast<std::size_t>(f.producer)];
      d.rstd_stride = descs[static_cast<std::size_t>(f.producer)].stats_stride;  // set: the producer is earlier
      d.rstd_first = static_cast<int32_t>(f.column / program::kBlockRows);
      d.rstd_blocks = static_cast<int32_t>((norm.x.cols + program::kBlockRows - 1) / program::kBlockRows);
      d.rstd_k = norm.x.cols;
      d.eps = norm.eps;
      check<Unavailable>(int64_t{m} * (d.rstd_blocks / 4 + 2) <= int64_t{p.shape.tokens} * program::kBlockRows,
                         "gemm program: folded norm op {} of {} columns at {} rows is above what is served", f.norm,
                         norm.x.cols, m);
    }
    p.packed.emplace_back(
        static_cast<std::size_t>(program::packed_bytes(g.weight.rows, g.weight.cols, p.shape.depth, gated)));
    program::pack_weight(g.weight.data, g.weight.rows, g.weight.cols, p.shape.depth, gated, scale,
                         p.packed.back().get(), nullptr);
    d.packed = p.packed.back().get();
    d.steps = program::steps_of(shapes[i], p.shape.depth);
    d.out = g.out.data;
    d.out_stride = g.out.row_stride;
    d.silu_mul = gated ? 1 : 0;
    if (reads < 0) {
      d.x_map[0] = d.x_map[1] =
          wgmma_tile_map(g.x.data, m, g.weight.cols, p.shape.tokens, p.shape.depth, m == 1 ? 0 : g.x.row_stride);
    } else {
      for (int e = 0; e < 2; ++e)
        d.x_map[e] = wgmma_tile_map(epochs + e * mailbox.epoch_elements + d.x_mailbox, m, g.weight.cols, p.shape.tokens,
                                    p.shape.depth, d.x_stride);
    }
  }
  p.ops = upload(descs);
  p.units = upload(plan.units);
  p.cta_begin = upload(plan.cta_begin);
  const std::size_t counter_words = ops.size() + 2;
  p.counters = DeviceBuffer(counter_words * 4);
  TPD_CUDA(cudaMemset(p.counters.get(), 0, counter_words * 4));
  const std::size_t scratch_bytes = static_cast<std::size_t>(std::max<int64_t>(plan.scratch_floats, 4)) * 4;
  p.scratch = DeviceBuffer(scratch_bytes);
  TPD_CUDA(cudaMemset(p.scratch.get(), 0xff, scratch_bytes));  // every slot empty
  if (record_timeline) {
    const std::size_t bytes =
        std::size_t{8} * static_cast<std::size_t>(p.grid * (1 + program::kTimelineFields * p.op_count)) * 8;
    p.timeline = DeviceBuffer(bytes);
    TPD_CUDA(cudaMemset(p.timeline.get(), 0, bytes));
  }
  // The packing, the uploads and the memsets (the legacy stream) before any run,
  // which may be on a stream that does not wait for the legacy one.
  TPD_CUDA(cudaDeviceSynchronize());

  auto* words = static_cast<uint32_t*>(p.counters.get());
  p.args.ops = static_cast<const program::OpDesc*>(p.ops.get());
  p.args.units = static_cast<const program::Unit*>(p.units.get());
  p.args.cta_begin = static_cast<const int32_t*>(p.cta_begin.get());
  p.args.counters = {words, words + ops.size(), words + ops.size() + 1};
  p.args.scratch = static_cast<float*>(p.scratch.get());
  p.args.mailbox = static_cast<uint32_t*>(p.mailbox.get());
  p.args.epoch_words = epoch_words;
  p.args.op_count = p.op_count;
  p.args.m = m;
  p.args.stages = p.shape.stages;
  p.args.inflight_stages = p.shape.inflight_stages;
  p.args.polling_inflight_stages = p.shape.polling_inflight_stages;
  p.args.timeline = static_cast<uint64_t*>(p.timeline.get());  // null without record_timeline
  p.args.team_ops = team_fragments > 0 ? 1 : 0;
  if (team != nullptr) {
    p.args.team = team->team;
    p.args.team_box = team->box;
  }
}

GemmProgram::~GemmProgram() = default;

void GemmProgram::run(cudaStream_t stream, bool pdl) const {
  int device = 0;
  TPD_CUDA(cudaGetDevice(&device));
  check(device == impl_->device, "gemm program: built on device {}, run on device {}", impl_->device, device);
  program::launch_program(impl_->args, impl_->shape, impl_->grid, pdl, stream);
}

std::vector<GemmProgram::RunTimeline> GemmProgram::timelines() const {
  const Impl& p = *impl_;
  if (p.args.timeline == nullptr) return {};
  const std::size_t per_cta = static_cast<std::size_t>(1 + program::kTimelineFields * p.op_count);
  std::vector<uint64_t> host(std::size_t{8} * static_cast<std::size_t>(p.grid) * per_cta);
  uint32_t runs = 0;
  TPD_CUDA(cudaDeviceSynchronize());
  TPD_CUDA(cudaMemcpy(host.data(), p.timeline.get(), host.size() * 8, cudaMemcpyDeviceToHost));
  TPD_CUDA(cudaMemcpy(&runs, p.args.counters.epoch, 4, cudaMemcpyDeviceToHost));
  std::vector<RunTimeline> out;
  for (uint32_t r = runs > 8 ? runs - 8 : 0; r < runs; ++r) {
    const uint64_t* slot = host.data() + (r % 8) * static_cast<std::size_t>(p.grid) * per_cta;
    RunTimeline t;
    for (int c = 0; c < p.grid; ++c) {
      const uint64_t* e = slot + static_cast<std::size_t>(c) * per_cta;
      t.sm.push_back(static_cast<uint32_t>(e[0]));
      for (int o = 0; o < p.op_count; ++o) {
        const uint64_t* f = e + 1 + program::kTimelineFields * o;
        t.ops.push_back({f[0], f[1], f[2], f[3], f[4]});
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

int GemmProgram::rows() const { return impl_->m; }
int GemmProgram::ops() const { return impl_->op_count; }
int GemmProgram::ctas() const { return impl_->grid; }
int GemmProgram::ring_stages() const { return impl_->shape.stages; }
int64_t GemmProgram::bytes() const { return impl_->bytes; }

}  // namespace tpdecode
