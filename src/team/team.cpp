#include "tpdecode/team.hpp"

#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/check.hpp"
#include "team/error_record.hpp"
#include "team/fill.hpp"
#include "team/rank_context.hpp"
#include "team/symmetric_layout.hpp"
#include "team/team_internals.hpp"
#include "tpdecode/comm.hpp"

namespace tpdecode {

namespace {

using Clock = std::chrono::steady_clock;

lamport::ErrorRecord* records(void* p) { return static_cast<lamport::ErrorRecord*>(p); }

// A positive integer from the environment variable `name`, else `fallback`.
uint64_t ms_from_env(const char* name, uint64_t fallback) {
  if (const char* env = std::getenv(name)) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(env, &end, 10);
    if (end != env && *end == '\0' && v > 0) return v;
  }
  return fallback;
}

// The deadlines where TeamOptions leaves them 0.
uint64_t default_timeout_ms() { return ms_from_env("TPDECODE_TIMEOUT_MS", 5000); }
uint64_t default_barrier_timeout_ms() { return ms_from_env("TPDECODE_BARRIER_TIMEOUT_MS", 30000); }

// Why a bound: the kernels' deadlines are nanoseconds since a start in 64 bits, the
// host's are steady_clock points; a deadline meant as "never" (a value near 2^64)
// would wrap below the start, and every wait would expire at once.
uint64_t bounded_ms(uint64_t ms, const char* what) {
  check(ms <= kMaxDeadlineMs, "{} of {} ms: at most {} ms (a day; TeamOptions or its environment variable)", what, ms,
        kMaxDeadlineMs);
  return ms;
}

}  // namespace

Team::Team(int size, const TeamOptions& options)
    : size_(size),
      timeout_ns_(bounded_ms(options.timeout_ms ? options.timeout_ms : default_timeout_ms(), "a team timeout") *
                  1000000ull),
      barrier_limit_(bounded_ms(options.barrier_timeout_ms ? options.barrier_timeout_ms : default_barrier_timeout_ms(),
                                "a barrier timeout")),
      pdl_(options.pdl) {
  check(supported_team_size(size), "team size {} is not supported (1, 2, 4, 8 or 16)", size);
}

Team::~Team() = default;

int Team::rank(int i) const { return context(i).rank; }
int Team::device(int i) const { return context(i).device; }

int Team::ranks_sharing_gpu() const {
  int n = 0;
  for (int i = 0; i < driven(); ++i) n += device(i) == device(0);
  return n;
}
cudaStream_t Team::stream(int i) const { return context(i).stream; }

const RankContext& Team::context(int i) const {
  check(i >= 0 && i < driven(), "driven rank {} outside [0, {})", i, driven());
  return *contexts_[static_cast<std::size_t>(i)];
}

std::chrono::milliseconds Team::default_limit() const {
  return std::chrono::milliseconds(timeout_ns_ / 1000000ull + 1000);
}

void Team::init_contexts(const std::vector<RankContext>& contexts, bool shares_memory) {
  shares_memory_ = shares_memory;
  const std::size_t n = contexts.size();
  TPD_CUDA(cudaHostAlloc(&errors_host_, sizeof(lamport::ErrorRecord) * n, cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(errors_host_, 0, sizeof(lamport::ErrorRecord) * n);
  for (std::size_t i = 0; i < n; ++i) {
    auto c = std::make_unique<RankContext>(contexts[i]);
    c->size = size_;
    c->pdl = pdl_;
    c->error_host = &records(errors_host_)[i];
    TPD_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&c->team.error), &records(errors_host_)[i], 0));
    c->team.rank = c->rank;
    c->team.size = size_;
    c->team.timeout_ns = timeout_ns_;
    contexts_.push_back(std::move(c));
  }
  if (!shares_memory_) return;
  const SymmetricBuffer control =
      detail::TeamInternals::allocate(*this, sizeof(lamport::ControlBlock), 0u, "control block");
  for (std::size_t i = 0; i < n; ++i) {
    lamport::TeamRef& t = contexts_[i]->team;
    for (int r = 0; r < size_; ++r)
      t.control[r] = static_cast<lamport::ControlBlock*>(control.peers(static_cast<int>(i)).base[r]);
    t.own = t.control[t.rank];
  }
}

void Team::release_all() {
  shared_comms_.clear();  // before the memory their mailboxes use
  for (SymmetricBuffer& b : buffers_) free_symmetric(b.local_);
  buffers_.clear();
  if (errors_host_) cudaFreeHost(errors_host_);
  errors_host_ = nullptr;
}

namespace detail {

const RankContext& TeamInternals::rank_context(const Team& team, int driven) { return team.context(driven); }

SymmetricBuffer TeamInternals::allocate(Team& team, std::size_t bytes, uint32_t fill_word, std::string_view what) {
  check<TeamBroken>(!team.broken(), "{}: a new collective object on a broken team; build a new team", team.describe());
  if (!team.shares_memory_)
    throw Unavailable(team.describe() + ": the ranks do not share memory (no symmetric buffers)");
  check(bytes > 0, "symmetric allocation of 0 bytes");
  const auto& contexts = team.contexts_;
  for (const auto& c : contexts) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    TPD_CUDA(cudaStreamIsCapturing(c->stream, &status));
    check(status == cudaStreamCaptureStatusNone, "symmetric buffers cannot be allocated during capture");
  }
  SymmetricBuffer b;
  b.bytes_ = (bytes + 15) / 16 * 16;
  b.fill_word_ = fill_word;
  const SymmetricLayout mine = symmetric_layout(team.buffers_.size(), b.bytes_, fill_word, what);
  std::vector<SymmetricLayout> ranks(static_cast<std::size_t>(team.size_));
  try {
    team.gather_host(&mine, sizeof mine, ranks.data(), team.barrier_limit_);
  } catch (const TeamBroken& e) {
    throw TeamBroken(fmt::format("{} (agreeing on symmetric allocation {}: {}; a rank that builds an object its "
                                 "peers do not build, or builds it later, waits here)",
                                 e.what(), mine.sequence, what));
  }
  check_layouts_agree(ranks);
  b.local_.resize(contexts.size());
  b.peers_.resize(contexts.size());
  team.allocate_symmetric(b.bytes_, b.local_, b.peers_);
  for (std::size_t i = 0; i < contexts.size(); ++i) {
    TPD_CUDA(cudaSetDevice(contexts[i]->device));
    fill_words(b.local_[i], b.bytes_ / 4, fill_word, contexts[i]->stream);
    TPD_CUDA(cudaStreamSynchronize(contexts[i]->stream));
  }
  team.barrier(team.barrier_limit_);
  team.buffers_.push_back(b);
  return b;
}

TpComm& TeamInternals::shared_comm(Team& team, const CommConfig& config, int group) {
  check<TeamBroken>(!team.broken(), "{}: a collective object on a broken team; build a new team", team.describe());
  check(group >= 0, "a shared TpComm's group {} (0 or more)", group);
  for (const auto& [g, c] : team.shared_comms_)
    if (g == group && c->config() == config) return *c;
  team.shared_comms_.emplace_back(group, std::make_unique<TpComm>(team, config));
  return *team.shared_comms_.back().second;
}

int TeamInternals::take_epoch_counter(Team& team) {
  check<CapacityError>(team.epoch_counters_ < lamport::kMaxMailboxes, "a team holds at most {} mailboxes",
                       lamport::kMaxMailboxes);
  return team.epoch_counters_++;
}

}  // namespace detail

bool Team::has_error() const {
  for (const auto& c : contexts_)
    if (c->error_host->flag != 0) return true;
  return false;
}

void Team::check_errors() const {
  check<TeamBroken>(!broken(), "{}: unusable since TeamBroken was raised; build a new team", describe());
  for (const auto& c : contexts_)
    if (lamport::ErrorRecord e; read_error_record(c->error_host, &e)) throw TimeoutError(describe_error(e));
}

bool Team::drain(int i, cudaStream_t stream, Clock::time_point until) const {
  TPD_CUDA(cudaSetDevice(contexts_[static_cast<std::size_t>(i)]->device));
  while (true) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) TPD_CUDA(e);
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::string Team::undrained(int i, std::span<const cudaStream_t> also, Clock::time_point until) const {
  if (!drain(i, stream(i), until)) return fmt::format("rank {}: its stream", rank(i));
  if (i == 0)
    for (std::size_t s = 0; s < also.size(); ++s)
      if (!drain(0, also[s], until)) return fmt::format("rank {}: the caller's stream {}", rank(0), s);
  return "";
}

uint32_t Team::read_abort_word(int i) const {
  if (!shares_memory_) return 0;
  const RankContext& c = *contexts_[static_cast<std::size_t>(i)];
  uint32_t word = 0;
  TPD_CUDA(cudaSetDevice(c.device));
  // Why the rank's own stream: it has drained, and a copy there waits for nothing else.
  TPD_CUDA(cudaMemcpyAsync(&word, &c.team.control[c.rank]->abort, sizeof word, cudaMemcpyDeviceToHost, c.stream));
  TPD_CUDA(cudaStreamSynchronize(c.stream));
  return word;
}

void Team::synchronize(std::chrono::milliseconds limit, std::span<const cudaStream_t> also) {
  if (limit.count() <= 0) limit = default_limit();
  const auto until = Clock::now() + limit;
  for (int i = 0; i < driven(); ++i) {
    const std::string stuck = undrained(i, also, until);
    if (stuck.empty()) continue;
    const std::string what = fmt::format(
        "{} did not drain within {} ms (a collective waits on a rank that does not arrive)", stuck, limit.count());
    check_errors();
    on_stuck(i, what);
    throw TeamBroken(what);  // a backend's on_stuck throws it first
  }
  check_errors();
  for (int i = 0; i < driven(); ++i)
    if (const uint32_t abort = read_abort_word(i); abort != 0)
      throw TimeoutError(fmt::format("rank {}: rank {} timed out and aborted the team; every rank must call reset()",
                                     rank(i), abort - 1));
}

void Team::reset(std::span<const cudaStream_t> also) {
  check<TeamBroken>(!broken(), "{}: reset() of a broken team; build a new one", describe());
  const auto until = Clock::now() + default_limit();
  for (int i = 0; i < driven(); ++i)
    if (const std::string stuck = undrained(i, also, until); !stuck.empty())
      on_stuck(i, fmt::format("reset: {} did not drain", stuck));
  barrier(barrier_limit_);  // no peer may still be pushing into a buffer we refill
  for (const SymmetricBuffer& b : buffers_)
    for (std::size_t i = 0; i < contexts_.size(); ++i) {
      TPD_CUDA(cudaSetDevice(contexts_[i]->device));
      fill_words(b.local_[i], b.bytes_ / 4, b.fill_word_, contexts_[i]->stream);
    }
  for (const auto& c : contexts_) {
    TPD_CUDA(cudaSetDevice(c->device));
    TPD_CUDA(cudaStreamSynchronize(c->stream));
  }
  std::memset(errors_host_, 0, sizeof(lamport::ErrorRecord) * contexts_.size());
  barrier(barrier_limit_);
}

}  // namespace tpdecode
