#include "team_object.hpp"

#include <fmt/format.h>
#include <tvm/ffi/reflection/registry.h>

#include <chrono>
#include <cmath>
#include <optional>

#include "core/streams.hpp"
#include "errors.hpp"

namespace tpdecode::python {
namespace {

namespace ffi = tvm::ffi;

CommAlgorithm parse_algorithm(const std::string& name) {
  if (name == "auto") return CommAlgorithm::kAuto;
  if (name == "one-shot") return CommAlgorithm::kOneShot;
  if (name == "two-shot") return CommAlgorithm::kTwoShot;
  if (name == "stock") return CommAlgorithm::kStock;
  raise(kind::kValue, fmt::format("algorithm '{}': one of auto, one-shot, two-shot, stock", name));
}

ArNormQuant parse_quant(const std::string& name) {
  if (name == "none") return ArNormQuant::kNone;
  if (name == "static") return ArNormQuant::kStatic;
  if (name == "group") return ArNormQuant::kGroup;
  if (name == "group-ue8m0") return ArNormQuant::kGroupUe8m0;
  raise(kind::kValue, fmt::format("quant '{}': one of none, static, group, group-ue8m0", name));
}

// The view a gathered shard travels as: 2-byte floats as bf16 words, float32 as
// f32, int32 as i32 (the mailbox changes no float but -0 to +0; i32 runs the stock
// path, comm.hpp). None: not gathered.
std::optional<DType> gather_view(const std::string& dtype) {
  if (dtype == "bfloat16" || dtype == "float16") return DType::kBF16;
  if (dtype == "float32") return DType::kF32;
  if (dtype == "int32") return DType::kI32;
  return std::nullopt;
}

}  // namespace

TeamObj::TeamObj(std::unique_ptr<Team> team) : team_(std::move(team)) {
  rank = team_->rank(0);
  size = team_->size();
  driven = team_->driven();
  device = team_->device(0);
  shares_memory = team_->shares_memory();
  kind = team_->kind() == TeamKind::kLocal ? "local" : "nccl";
  description = team_->describe();
  for (int i = 0; i < team_->driven(); ++i) streams_.push_back(team_->stream(i));
}

void TeamObj::build_comm(int64_t hidden, int64_t rows, int64_t gather_row_bytes, const ffi::String& algorithm,
                         bool batch_invariant) {
  translated([&] {
    if (comm_) raise(kind::kValue, "the team's comm is already built");
    CommConfig config;
    config.hidden = hidden;
    config.rows_cap = static_cast<int>(rows);
    config.gather_row_bytes = gather_row_bytes;
    config.algorithm = parse_algorithm(algorithm);
    config.batch_invariant = batch_invariant;
    DeviceScope scope(static_cast<int>(device));
    comm_ = std::make_unique<TpComm>(*team_, config);
  });
}

void TeamObj::set_algorithm(const ffi::String& algorithm) {
  const CommAlgorithm a = parse_algorithm(algorithm);
  comm().set_algorithm(a);
}

std::string TeamObj::dtype_refusal(const std::string& op, const std::string& dtype) const {
  if (op == "gather")
    return gather_view(dtype) ? "" : fmt::format("gather: dtype {}; tpdecode gathers bfloat16, float16, float32 and int32", dtype);
  return dtype == "bfloat16" ? "" : fmt::format("{}: dtype {}; tpdecode reduces bfloat16", op, dtype);
}

std::string TeamObj::shape_refusal(const std::string& op, int64_t rows, int64_t cols, int64_t element_bytes) const {
  const CommConfig& c = comm().config();
  if (op == "gather") {
    const int64_t bytes = cols * element_bytes;
    const int64_t widest = c.gather_row_bytes ? c.gather_row_bytes : c.hidden * 2;
    if (bytes % 16 != 0) return fmt::format("gather: shard rows of {} bytes; tpdecode takes multiples of 16", bytes);
    if (bytes * size > widest)
      return fmt::format("gather: {} ranks x {} bytes per row; the team was built for gathered rows of {} bytes "
                         "(gather_row_bytes)", size, bytes, widest);
  } else {
    if (op == "all_reduce" && cols % 8 != 0)
      return fmt::format("all_reduce: rows of {} elements; tpdecode takes multiples of 8", cols);
    if (op == "ar_norm" && !ar_norm_hidden_served(cols))
      return fmt::format("ar_norm: hidden {}; tpdecode takes multiples of 64 up to {}", cols, kArNormMaxHidden);
    if (cols > c.hidden)
      return fmt::format("{}: rows of {} elements; the team was built for {} (hidden)", op, cols, c.hidden);
  }
  // Why not batch-invariant: there more rows run as further calls.
  if (rows > c.rows_cap && !c.batch_invariant)
    return fmt::format("{}: {} rows; the team was built for {} (rows)", op, rows, c.rows_cap);
  return "";
}

void TeamObj::bind_quant(ArNormQuant quant, const ffi::Optional<DLView>& scale, int64_t rows, int64_t hidden,
                         std::vector<ArNormIo>& io) const {
  const int n = static_cast<int>(driven), dev = static_cast<int>(device);
  if (!scale.has_value()) raise(kind::kValue, fmt::format("ar_norm: quant {} needs a scale tensor", ar_norm_quant_name(quant)));
  const DLView s = scale.value();
  if (quant != ArNormQuant::kStatic && !ar_norm_group_quant_served(hidden))
    raise(kind::kNotServed, fmt::format("ar_norm: hidden {}; the group quantisation takes multiples of {}", hidden,
                                        8 * kArNormQuantGroup));
  if (dtype_text(s.dtype()) != "float32")
    raise(kind::kType, fmt::format("ar_norm: scale has dtype {}, float32 is required", dtype_text(s.dtype())));
  const auto scales = quant == ArNormQuant::kStatic ? rank_rows(s, 1, dev, DType::kF32, "ar_norm: scale")
                                                    : rank_rows(s, n, dev, DType::kF32, "ar_norm: scales");
  if (quant == ArNormQuant::kStatic && scales[0].rows * scales[0].cols != 1)
    raise(kind::kValue, fmt::format("ar_norm: the static scale has {} elements, 1 is required",
                                    scales[0].rows * scales[0].cols));
  if (quant != ArNormQuant::kStatic && (scales[0].rows != rows || scales[0].cols != hidden / kArNormQuantGroup))
    raise(kind::kValue, fmt::format("ar_norm: scales are [{}, {}] per rank, [{}, {}] is required", scales[0].rows,
                                    scales[0].cols, rows, hidden / kArNormQuantGroup));
  for (int i = 0; i < n; ++i) {
    io[static_cast<std::size_t>(i)].quant = quant;
    io[static_cast<std::size_t>(i)].scale =
        quant == ArNormQuant::kStatic ? TensorView::f32(scales[0].data, 1, 1) : scales[static_cast<std::size_t>(i)];
  }
}

TpComm& TeamObj::comm() const {
  if (!comm_) raise(kind::kValue, "the team has no comm (build_comm was not called)");
  return *comm_;
}

void TeamObj::on_rank_streams(const std::function<void(std::span<const cudaStream_t>)>& enqueue) {
  DeviceScope scope(static_cast<int>(device));
  cudaStream_t origin = current_stream(static_cast<int>(device));
  if (driven == 1) {
    enqueue(std::span<const cudaStream_t>(&origin, 1));
    return;
  }
  // Why the team's streams: the local team's ranks spin-wait on each other, so they
  // must run concurrently, never queued on one stream.
  fork_streams(origin, streams_);
  try {
    enqueue(std::span<const cudaStream_t>(streams_));
  } catch (...) {
    join_streams(origin, streams_);
    throw;
  }
  join_streams(origin, streams_);
}

template <class Io, class Call>
int64_t TeamObj::run(const std::vector<Io>& io, Call call) {
  TpComm& c = comm();
  CommResult r;
  on_rank_streams([&](std::span<const cudaStream_t> streams) { r = call(c, std::span<const Io>(io), streams); });
  if (!r.why.empty() || !last_why_.empty()) last_why_ = std::move(r.why);
  return static_cast<int64_t>(r.path);
}

int64_t TeamObj::all_reduce(DLView x, DLView out) {
  return translated([&] {
    const int n = static_cast<int>(driven), dev = static_cast<int>(device);
    if (std::string why = dtype_refusal("all_reduce", dtype_text(x.dtype())); !why.empty())
      raise(kind::kUnsupportedDType, why);
    const auto xs = rank_rows(x, n, dev, DType::kBF16, "all_reduce: x");
    if (std::string why = shape_refusal("all_reduce", xs[0].rows, xs[0].cols, 2); !why.empty())
      raise(kind::kNotServed, why);
    require_bf16(out, "all_reduce: out");
    const auto outs = rank_rows(out, n, dev, DType::kBF16, "all_reduce: out");
    std::vector<AllReduceIo> io;
    for (int i = 0; i < n; ++i) io.push_back({xs[i], outs[i]});
    return run(io, [](TpComm& c, auto ios, auto streams) { return c.all_reduce(ios, streams); });
  });
}

int64_t TeamObj::ar_norm(DLView x, ffi::Optional<DLView> residual, DLView weight, double eps, DLView out,
                         DLView residual_out, const ffi::String& quant_name, ffi::Optional<DLView> scale) {
  return translated([&] {
    const int n = static_cast<int>(driven), dev = static_cast<int>(device);
    // Why first: a bad eps is the caller's error, never a call to hand to the fallback.
    if (!std::isfinite(eps) || eps < 0)
      raise(kind::kValue, fmt::format("ar_norm: eps {} (a finite number >= 0 is required)", eps));
    if (std::string why = dtype_refusal("ar_norm", dtype_text(x.dtype())); !why.empty())
      raise(kind::kUnsupportedDType, why);
    const auto xs = rank_rows(x, n, dev, DType::kBF16, "ar_norm: x");
    const int64_t hidden = xs[0].cols;
    if (std::string why = shape_refusal("ar_norm", xs[0].rows, hidden, 2); !why.empty()) raise(kind::kNotServed, why);
    std::vector<TensorView> rs(static_cast<std::size_t>(n));  // data == nullptr: no residual
    if (residual.has_value()) {
      require_bf16(*residual, "ar_norm: residual");
      rs = rank_rows(*residual, n, dev, DType::kBF16, "ar_norm: residual");
    }
    require_bf16(weight, "ar_norm: weight");
    const TensorView w = rank_rows(weight, 1, dev, DType::kBF16, "ar_norm: weight")[0];
    if (w.rows * w.cols != hidden)
      raise(kind::kValue, fmt::format("ar_norm: weight has {} elements, hidden is {}", w.rows * w.cols, hidden));
    const ArNormQuant quant = parse_quant(quant_name);
    // Why 1-byte elements for e4m3: it crosses as a uint8 view (DLPack's float8 codes
    // are not every framework's).
    if (quant == ArNormQuant::kNone) require_bf16(out, "ar_norm: out");
    require_bf16(residual_out, "ar_norm: residual_out");
    const auto outs = rank_rows(out, n, dev, quant == ArNormQuant::kNone ? DType::kBF16 : DType::kE4M3, "ar_norm: out");
    const auto res_outs = rank_rows(residual_out, n, dev, DType::kBF16, "ar_norm: residual_out");
    std::vector<ArNormIo> io;
    for (int i = 0; i < n; ++i)
      io.push_back({xs[i], rs[i], TensorView::bf16(w.data, 1, hidden), static_cast<float>(eps), outs[i], res_outs[i]});
    if (quant != ArNormQuant::kNone) bind_quant(quant, scale, xs[0].rows, hidden, io);
    return run(io, [](TpComm& c, auto ios, auto streams) { return c.ar_norm(ios, streams); });
  });
}

int64_t TeamObj::gather(DLView shard, DLView out) {
  return translated([&] {
    const int n = static_cast<int>(driven), dev = static_cast<int>(device);
    const std::string dtype = dtype_text(shard.dtype());
    if (std::string why = dtype_refusal("gather", dtype); !why.empty()) raise(kind::kUnsupportedDType, why);
    const DType as = *gather_view(dtype);
    const auto shards = rank_rows(shard, n, dev, as, "gather: shard");
    if (std::string why = shape_refusal("gather", shards[0].rows, shards[0].cols, dtype_size(as)); !why.empty())
      raise(kind::kNotServed, why);
    if (dtype_text(out.dtype()) != dtype)
      raise(kind::kType, fmt::format("gather: out has dtype {}, the shard {}", dtype_text(out.dtype()), dtype));
    const auto outs = rank_rows(out, n, dev, as, "gather: out");
    std::vector<GatherIo> io;
    for (int i = 0; i < n; ++i) io.push_back({shards[i], outs[i]});
    return run(io, [](TpComm& c, auto ios, auto streams) { return c.gather(ios, streams); });
  });
}

void TeamObj::check_errors() const {
  translated([&] { team_->check_errors(); });
}

// Why the caller's stream as well: the calls ran there (an NCCL team's) or were
// joined back to it (a local team's), and torch graphs replay there. Why passed in:
// the environment's stream is set only for calls with tensors.
void TeamObj::synchronize(int64_t limit_ms, int64_t stream) {
  translated([&] {
    DeviceScope scope(static_cast<int>(device));
    const auto caller = reinterpret_cast<cudaStream_t>(stream);
    team_->synchronize(std::chrono::milliseconds(limit_ms), std::span<const cudaStream_t>(&caller, 1));
  });
}

void TeamObj::reset(int64_t stream) {
  translated([&] {
    DeviceScope scope(static_cast<int>(device));
    const auto caller = reinterpret_cast<cudaStream_t>(stream);
    team_->reset(std::span<const cudaStream_t>(&caller, 1));
  });
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::ObjectDef<TeamObj>(refl::init(false))
      .def_ro("rank", &TeamObj::rank)
      .def_ro("size", &TeamObj::size)
      .def_ro("driven", &TeamObj::driven)
      .def_ro("device", &TeamObj::device)
      .def_ro("shares_memory", &TeamObj::shares_memory)
      .def_ro("kind", &TeamObj::kind)
      .def_ro("description", &TeamObj::description)
      .def("build_comm", &TeamObj::build_comm)
      .def("set_algorithm", &TeamObj::set_algorithm)
      .def("all_reduce", &TeamObj::all_reduce)
      .def("ar_norm", &TeamObj::ar_norm)
      .def("gather", &TeamObj::gather)
      .def("last_why", &TeamObj::last_why)
      .def("check_errors", &TeamObj::check_errors)
      .def("synchronize", &TeamObj::synchronize)
      .def("reset", &TeamObj::reset);
}

}  // namespace tpdecode::python
