#include "tpdecode/decode_gemm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "core/check.hpp"
#include "core/tensor_overlap.hpp"
#include "gemm/adjacent_links.hpp"
#include "gemm/chain_timing.hpp"
#include "gemm/gemm_paths.hpp"
#include "gemm/wgmma_launch.hpp"
#include "gemm/wgmma_plan.hpp"

namespace tpdecode {
namespace {

// cuBLASLt's heuristic algorithms the tuner times besides cuBLAS's default.
constexpr int kLtCandidates = 3;

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TPD_CUDA(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

void require_matrix(const TensorView& t, int64_t cols, const char* what) {
  check(t.data != nullptr, "decode_gemm: {} is null", what);
  check(t.dtype == DType::kBF16, "decode_gemm: {} is {} where bf16 is required", what, dtype_name(t.dtype));
  check(t.rows >= 1, "decode_gemm: {} has {} rows", what, t.rows);
  check(t.cols == cols, "decode_gemm: {} has {} columns where {} are required", what, t.cols, cols);
  // Why not check(): its arguments are evaluated on every call, describe() formats.
  if (t.row_stride < t.cols) [[unlikely]]
    throw InvalidArgument(fmt::format("decode_gemm: {} row stride below its columns ({})", what, t.describe()));
  check(reinterpret_cast<std::uintptr_t>(t.data) % 2 == 0, "decode_gemm: {} is not 2-byte aligned", what);
}

// A contiguous [m, cols] operand's shape (cuBLASLt's checks read shapes only).
TensorView shape_of(int64_t m, int64_t cols) { return {nullptr, DType::kBF16, m, cols, cols}; }

// cuBLASLt algorithms are chosen for contiguous, 16-byte-aligned operands.
bool lt_operands(const TensorView& x, const TensorView& out) {
  return x.contiguous() && x.aligned(16) && out.contiguous() && out.aligned(16);
}

}  // namespace

// The weight's tile maps, made when a decision first needs one (host only): by a
// block's rows for either wgmma form, and the warp engine's tensor-map form's.
struct DecodeGemm::TileMaps {
  std::map<int, CUtensorMap> by_rows;
  std::optional<CUtensorMap> warp;
  static bool needs(const GemmDecision& d) { return wgmma_path(d.path) || warp_tensor_map(d); }
  static int rows(const GemmDecision& d) { return wgmma_shape_of(d, 1).rows(); }
  // The map decision d launches with; null where it needs none or it is not made yet.
  const CUtensorMap* find(const GemmDecision& d) const {
    if (warp_tensor_map(d)) return warp ? &*warp : nullptr;
    if (!wgmma_path(d.path)) return nullptr;
    const auto it = by_rows.find(rows(d));
    return it == by_rows.end() ? nullptr : &it->second;
  }
  void make(const GemmDecision& d, const TensorView& weight) {
    if (!needs(d) || find(d)) return;
    if (warp_tensor_map(d))
      warp = warp_tensor_map_of(weight);
    else
      by_rows.emplace(rows(d), wgmma_tile_map(weight.data, weight.rows, weight.cols, rows(d)));
  }
};

DecodeGemm::~DecodeGemm() = default;

DecodeGemm::DecodeGemm(const TensorView& weight, std::shared_ptr<CublasContext> cublas,
                       std::shared_ptr<GemmTuner> tuner)
    : weight_(weight), cublas_(std::move(cublas)), tuner_(std::move(tuner)) {
  require_matrix(weight, weight.cols, "weight");
  check(weight.cols >= 1, "decode_gemm: weight has no columns");
  if (!cublas_) cublas_ = std::make_shared<CublasContext>();
  if (!tuner_) tuner_ = GemmTuner::shared();
  engines_ = {warp_weight_ok(weight), wgmma_weight_ok(weight)};
  maps_ = std::make_unique<TileMaps>();
  TPD_CUDA(cudaGetDevice(&device_));
  cudaDeviceProp props{};
  TPD_CUDA(cudaGetDeviceProperties(&props, device_));
  sms_ = props.multiProcessorCount;
  device_name_ = props.name;
}

GemmKey DecodeGemm::key(int m) const { return key(m, chain_); }

GemmKey DecodeGemm::key(int m, bool chain) const {
  static const std::string version = gemm_library_version();
  return {device_name_, sms_, version, n(), k(), gemm_m_bucket(m), DType::kBF16, chain, sharing_};
}

void DecodeGemm::set_chain(bool on) {
  if (on == chain_) return;
  chain_ = on;
  if (!invariant_) forget_decisions();  // a batch-invariant GEMM's decisions depend on nothing else
}

void DecodeGemm::set_batch_invariant(bool on, int rows) {
  if (!on) {
    if (invariant_) forget_decisions();
    invariant_ = false;
    return;
  }
  check(rows >= 1 && rows <= kGemmMaxRows, "decode_gemm: batch-invariant mode for {} rows (1..{})", rows,
        kGemmMaxRows);
  if (invariant_ && rows == invariant_rows_) return;
  adopt_invariant_decisions(rows);
}

GemmDecision DecodeGemm::invariant_order(int rows) {
  const int timed = gemm_bucket_max(gemm_m_bucket(rows));  // the hint's bucket, timed at its most rows
  const GemmDecision rule = invariant_decision(n(), k(), timed, sms_, engines_, sharing_ > 1, rows);
  const std::vector<GemmDecision> candidates = invariant_candidates(n(), k(), timed, engines_, sharing_ > 1);
  GemmKey key = this->key(rows);
  key.chain = false;  // why: a batch-invariant GEMM's decisions depend on nothing else
  key.invariant = true;
  // Why the legacy stream: set_batch_invariant takes none (host only, never under capture).
  const GemmMeasure measure = [&](const std::vector<GemmDecision>& c) {
    return time_paths(c, weight_, timed, *cublas_, pdl_, nullptr,
                      [this](const std::string& message) { tuner_->warn(message); });
  };
  const GemmDecision d = resolve_decision(*tuner_, key, device_, candidates, measure, rule, agree_);
  const bool known = std::any_of(candidates.begin(), candidates.end(),
                                 [&](const GemmDecision& c) { return same_summation_order(c, d); });
  if (known) return d;
  // Why throw for a team's order: another one than the peers' gives other bits.
  check(!agree_, "decode_gemm: the team's batch-invariant order for {} ({}) cannot run on this rank",
        key.describe(), describe(d));
  tuner_->warn(fmt::format("decode_gemm: cached batch-invariant order {} for {} cannot run here; the static rule "
                           "runs it", describe(d), key.describe()));
  return rule;
}

void DecodeGemm::adopt_invariant_decisions(int rows) {
  check(engines_.warp || engines_.wgmma,
        "decode_gemm: batch-invariant mode needs one of the engines, and neither takes a {}x{} weight", n(), k());
  forget_decisions();
  invariant_ = false;
  try {
    const GemmDecision order = invariant_order(rows);
    for (int b = 0; b < kGemmBuckets; ++b) {
      const bool timed = b == gemm_m_bucket(rows);  // the hint's bucket runs the order as timed
      GemmDecision d = timed ? order : invariant_member(order, gemm_bucket_max(b));
      if (!timed) d.measured_us = 0;
      adopt(gemm_bucket_max(b), d);
    }
  } catch (...) {
    // Why: a GEMM is either batch-invariant in every bucket or in none.
    forget_decisions();
    throw;
  }
  invariant_rows_ = rows;
  invariant_ = true;
}

void DecodeGemm::set_sharing(int ranks) {
  check(ranks >= 1 && ranks <= 64, "decode_gemm: {} ranks sharing the GPU (1..64)", ranks);
  if (ranks == sharing_) return;
  sharing_ = ranks;
  // Why again: the invariant engine and split depend on whether ranks share the GPU.
  if (invariant_)
    adopt_invariant_decisions(invariant_rows_);
  else
    forget_decisions();
}

std::vector<GemmDecision> DecodeGemm::candidates(int m) {
  std::vector<GemmDecision> all = engine_candidates(n(), k(), m, engines_, sms_);
  if (sharing_ > 1)
    std::erase_if(all, [](const GemmDecision& d) {
      return (d.path == GemmPath::kWarpSplitK || wgmma_path(d.path)) && !warp_split_for_shared_gpu(d.split);
    });
  GemmDecision lt;
  lt.path = GemmPath::kCublasLt;
  lt.source = GemmSource::kTuned;
  for (const CublasLtAlgo& a : cublas_->lt_algorithms(shape_of(m, k()), weight_, shape_of(m, n()), kLtCandidates)) {
    lt.lt_algo = a;
    all.push_back(lt);
  }
  return all;
}

void DecodeGemm::prepare(int m, cudaStream_t stream) {
  check(!capturing(stream), "decode_gemm: prepare() under stream capture");
  if (!engine_eligible() || m < 1 || m > kGemmMaxRows || decisions_[gemm_m_bucket(m)]) return;
  adopt(m, resolve(m, chain_, stream));
}

GemmDecision DecodeGemm::resolve(int m, bool chain, cudaStream_t stream) {
  const int rows = gemm_bucket_max(gemm_m_bucket(m));  // what the bucket is timed and prepared at
  const GemmDecision rule = rule_decision(n(), k(), rows, sms_, engines_, sharing_ > 1);
  const GemmMeasure measure = [&](const std::vector<GemmDecision>& c) {
    std::unique_ptr<GemmTiming> t = time_paths(c, weight_, rows, *cublas_, pdl_, stream,
                                               [this](const std::string& message) { tuner_->warn(message); });
    return chain ? charge_chain_boundaries(c, rows, std::move(t)) : std::move(t);
  };
  GemmDecision d = resolve_decision(*tuner_, key(m, chain), device_, candidates(rows), measure, rule, agree_);
  const bool runs = engine_decision_legal(d, n(), k(), rows, sms_, engines_) &&
                    (d.path != GemmPath::kCublasLt ||
                     cublas_->lt_algorithm_ok(shape_of(rows, k()), weight_, shape_of(rows, n()), d.lt_algo));
  if (!runs) {
    // Why throw for a team's decision: running another path than the peers would
    // break bitwise agreement of replicated GEMMs silently.
    check(!agree_, "decode_gemm: the team's decision for {} ({}) cannot run on this rank", key(m, chain).describe(),
          describe(d));
    tuner_->warn(fmt::format("decode_gemm: cached decision {} for {} cannot run here; the static rule runs it",
                             describe(d), key(m, chain).describe()));
    d = rule;
  }
  return d;
}

void DecodeGemm::decide_adjacent(const std::vector<DecodeGemm*>& links, int m, cudaStream_t stream) {
  check(!capturing(stream), "decode_gemm: decide_adjacent() under stream capture");
  std::vector<LinkOptions> options(links.size());
  struct TwoOptions {
    GemmDecision chained;  // its PDL option
    GemmDecision alone;    // its stock option
  };
  std::vector<std::optional<TwoOptions>> two(links.size());  // where a link has both
  bool agreed = false;  // a link's decisions are its team's
  for (std::size_t i = 0; i < links.size(); ++i) {
    DecodeGemm& g = *links[i];
    check(g.chain(), "decode_gemm: decide_adjacent() on a GEMM not marked set_chain(true) ({}x{})", g.n(), g.k());
    agreed = agreed || static_cast<bool>(g.agree_);
    g.prepare(m, stream);
    const std::optional<GemmDecision> chained =
        g.prepared(m) ? std::optional<GemmDecision>(g.decision(m)) : std::nullopt;  // none: cuBLAS, always
    const bool measured =
        chained && chained->source != GemmSource::kForced && chained->measured_us > 0 && !g.invariant_;
    const bool overlaps = chained && !charged_in_chains(*chained, m);
    if (!measured || !overlaps) {
      // One option: its path, whatever the neighbours (its time is the same in every assignment).
      (overlaps ? options[i].pdl_us : options[i].stock_us) = 0;
      continue;
    }
    options[i].pdl_us = chained->measured_us;
    const GemmDecision a = g.resolve(m, false, stream);
    if (charged_in_chains(a, m) && a.measured_us > 0) {
      options[i].stock_us = a.measured_us;
      two[i] = TwoOptions{*chained, a};
    }
  }
  const std::vector<std::vector<bool>> assignments = adjacent_assignments(options, kChainBoundaryUs / 2);
  auto apply = [&](std::size_t j) {
    for (std::size_t i = 0; i < links.size(); ++i)
      if (two[i]) links[i]->adopt(m, assignments[j][i] ? two[i]->chained : two[i]->alone);
  };
  // Why the chain is timed where the assignments differ: the model prices a boundary
  // the same beside every neighbour, and a link can cost its neighbours far more (TP 4
  // gate_up at M 1: a 144-CTA chain decision ran ~10 us a layer slower in the chain
  // than its own timing said). Not in a team: each rank would time its own.
  const bool tuning = std::all_of(links.begin(), links.end(), [](const DecodeGemm* g) { return g->tuner_->enabled(); });
  std::size_t chosen = 0;
  if (assignments.size() > 1 && !agreed && tuning) {
    try {
      chosen = fastest_chain_assignment(links, m, assignments.size(), apply, stream);
    } catch (const Error& e) {
      cudaGetLastError();
      links[0]->tuner_->warn(fmt::format("decode_gemm: timing a chain of {} links at {} rows failed ({}); the "
                                         "boundary model's assignment runs it",
                                         links.size(), m, e.what()));
    }
  }
  apply(chosen);
}

void DecodeGemm::adopt(int m, GemmDecision d) {
  const RelaxedCaptureMode relaxed;
  d = prepare_path(d, weight_, gemm_bucket_max(gemm_m_bucket(m)));
  maps_->make(d, weight_);
  decisions_[gemm_m_bucket(m)] = d;
  lt_verified_[static_cast<std::size_t>(gemm_m_bucket(m))] = 0;
}

void DecodeGemm::forget_decisions() {
  decisions_ = {};
  lt_verified_ = {};
}

void DecodeGemm::force(int m, const GemmDecision& d) {
  check(engine_eligible() && m >= 1 && m <= kGemmMaxRows, "decode_gemm: force() for {} rows of {}x{}", m, n(), k());
  check(!invariant_, "decode_gemm: force() on a batch-invariant GEMM (its decisions are fixed)");
  const int rows = gemm_bucket_max(gemm_m_bucket(m));
  check(engine_decision_legal(d, n(), k(), rows, sms_, engines_), "decode_gemm: {} cannot run {}x{} at {} rows",
        describe(d), n(), k(), m);
  check(d.path != GemmPath::kCublasLt ||
            cublas_->lt_algorithm_ok(shape_of(rows, k()), weight_, shape_of(rows, n()), d.lt_algo),
        "decode_gemm: {} does not run {}x{} at {} rows", describe(d), n(), k(), m);
  GemmDecision forced = d;
  forced.source = GemmSource::kForced;
  adopt(m, forced);
}

bool DecodeGemm::prepared(int m) const {
  return m >= 1 && m <= kGemmMaxRows && decisions_[gemm_m_bucket(m)].has_value();
}

const GemmDecision& DecodeGemm::decision(int m) const {
  check(prepared(m), "decode_gemm: no decision prepared for {} rows", m);
  return *decisions_[gemm_m_bucket(m)];
}

GemmDecision DecodeGemm::unprepared_decision(int m) const {
  const int rows = gemm_bucket_max(gemm_m_bucket(m));
  const GemmDecision rule = rule_decision(n(), k(), rows, sms_, engines_, sharing_ > 1);
  if (agree_) return rule;  // every rank's static rule is the same
  const std::optional<GemmDecision> cached = tuner_->cached(key(m));
  return cached && engine_decision_legal(*cached, n(), k(), rows, sms_, engines_) ? *cached : rule;
}

bool DecodeGemm::lt_runs(const GemmDecision& d, const TensorView& x, const TensorView& out, bool stored) const {
  if (!lt_operands(x, out)) return false;
  const int m = static_cast<int>(x.rows);
  if (!stored || m < 1 || m > kGemmMaxRows) return cublas_->lt_algorithm_ok(x, weight_, out, d.lt_algo);
  // Why a kept verdict: the check (descriptors and cublasLtMatmulAlgoCheck) reads the
  // operands' shapes only, which for contiguous operands are m's; it was per call.
  const uint64_t bit = uint64_t{1} << (m - 1);
  uint64_t& verified = lt_verified_[static_cast<std::size_t>(gemm_m_bucket(m))];
  if (verified & bit) return true;
  if (!cublas_->lt_algorithm_ok(x, weight_, out, d.lt_algo)) return false;
  verified |= bit;
  return true;
}

GemmPath DecodeGemm::runnable(const GemmDecision& d, const TensorView& x, const TensorView& out, bool stored) const {
  if (d.path == GemmPath::kCublasLt) return lt_runs(d, x, out, stored) ? GemmPath::kCublasLt : GemmPath::kCublas;
  const bool mapped = !TileMaps::needs(d) || maps_->find(d);
  // Why no row check: both engines take every row count up to kGemmMaxRows.
  static_assert(kWarpMaxRows == kGemmMaxRows);
  return path_prepared(d) && mapped ? d.path : GemmPath::kCublas;
}

GemmPath DecodeGemm::path(int m) const {
  if (!engine_eligible() || m < 1 || m > kGemmMaxRows) return GemmPath::kCublas;
  const bool stored = prepared(m);
  const GemmDecision d = stored ? *decisions_[gemm_m_bucket(m)] : unprepared_decision(m);
  return runnable(d, shape_of(m, k()), shape_of(m, n()), stored);
}

GemmPath DecodeGemm::path(const TensorView& x, const TensorView& out) const {
  check_operands(x, out);
  if (!engine_takes(x)) return GemmPath::kCublas;
  const int m = static_cast<int>(x.rows);
  const bool stored = prepared(m);
  return runnable(stored ? *decisions_[gemm_m_bucket(m)] : unprepared_decision(m), x, out, stored);
}

void DecodeGemm::check_operands(const TensorView& x, const TensorView& out) const {
  require_matrix(x, k(), "x");
  require_matrix(out, n(), "out");
  check(out.rows == x.rows, "decode_gemm: out has {} rows, x has {}", out.rows, x.rows);
  // Why: every CTA reads all of x while others store their tiles of out.
  check_writes_apart("decode_gemm", {{&out, "out"}}, {{&x, "x"}, {&weight_, "the weight"}});
}

bool DecodeGemm::engine_takes(const TensorView& x) const { return engine_eligible() && engine_activations_ok(x); }

GemmPath DecodeGemm::run(const TensorView& x, const TensorView& out, cudaStream_t stream) {
  int current = 0;
  TPD_CUDA(cudaGetDevice(&current));
  check(current == device_, "decode_gemm: built on device {}, run on device {}", device_, current);
  check_operands(x, out);
  // Why: in batch-invariant mode cuBLAS in place of the order would give the rows
  // other bits, silently.
  const bool keeps_order = invariant_ && x.rows >= 1 && x.rows <= kGemmMaxRows;
  if (!engine_takes(x)) {
    check(!keeps_order, "decode_gemm: batch-invariant mode takes x contiguous and 16-byte aligned ({})", x.describe());
    cublas_->gemm(x, weight_, out, stream);
    return GemmPath::kCublas;
  }
  const int m = static_cast<int>(x.rows);
  if (!prepared(m) && !capturing(stream)) prepare(m, stream);
  const bool stored = prepared(m);
  const GemmDecision d = stored ? *decisions_[gemm_m_bucket(m)] : unprepared_decision(m);
  const GemmPath p = runnable(d, x, out, stored);
  check(!keeps_order || p == d.path, "decode_gemm: the batch-invariant order ({}) is not prepared on this device",
        describe(d));
  const CUtensorMap* map = p == d.path ? maps_->find(d) : nullptr;
  launch_path(p == d.path ? d : cublas_decision(), weight_, x, out, *cublas_, pdl_, stream, map);
  return p;
}

}  // namespace tpdecode
