#include "tpdecode/team.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "tpdecode/error.hpp"
#include "team/fill.hpp"

namespace tpdecode {

uint64_t default_timeout_ms() {
  if (const char* env = std::getenv("TPDECODE_TIMEOUT_MS")) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(env, &end, 10);
    if (end != env && *end == '\0' && v > 0) return v;
  }
  return 5000;
}

Team::Team(int size, const TeamOptions& options)
    : size_(size),
      timeout_ns_((options.timeout_ms ? options.timeout_ms : default_timeout_ms()) * 1000000ull),
      pdl_(options.pdl) {
  require(supported_team_size(size),
          fmt::format("team size {} is not supported (1, 2, 4, 8 or 16)", size));
}

Team::~Team() = default;

void Team::init_contexts(std::vector<RankContext> contexts) {
  TPD_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&errors_host_), sizeof(MailboxError) * contexts.size(),
                         cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(errors_host_, 0, sizeof(MailboxError) * contexts.size());
  for (std::size_t i = 0; i < contexts.size(); ++i) {
    RankContext& c = contexts[i];
    c.size = size_;
    c.timeout_ns = timeout_ns_;
    c.pdl = pdl_;
    c.error_host = &errors_host_[i];
    TPD_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&c.error_device), &errors_host_[i], 0));
  }
  contexts_ = std::move(contexts);
}

void Team::release_all() {
  for (SymmetricBuffer& b : buffers_) free_symmetric(b.local_);
  buffers_.clear();
  if (errors_host_) cudaFreeHost(errors_host_);
  errors_host_ = nullptr;
}

SymmetricBuffer Team::allocate(std::size_t bytes, uint32_t fill_word) {
  require(bytes > 0, "symmetric allocation of 0 bytes");
  for (const RankContext& c : contexts_) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    TPD_CUDA(cudaStreamIsCapturing(c.stream, &status));
    require(status == cudaStreamCaptureStatusNone, "symmetric buffers cannot be allocated during capture");
  }
  SymmetricBuffer b;
  b.bytes_ = (bytes + 15) / 16 * 16;
  b.fill_word_ = fill_word;
  b.local_.resize(contexts_.size());
  b.peers_.resize(contexts_.size());
  allocate_symmetric(b.bytes_, b.local_, b.peers_);
  for (std::size_t i = 0; i < contexts_.size(); ++i) {
    TPD_CUDA(cudaSetDevice(contexts_[i].device));
    fill_words(b.local_[i], b.bytes_ / 4, fill_word, contexts_[i].stream);
  }
  synchronize();
  barrier();
  buffers_.push_back(b);
  return b;
}

bool Team::has_error() const {
  for (const RankContext& c : contexts_)
    if (c.error_host->flag != 0) return true;
  return false;
}

void Team::check_errors() const {
  for (const RankContext& c : contexts_)
    if (MailboxError e; read_error(c.error_host, &e)) throw TimeoutError(tpdecode::describe(e));
}

void Team::synchronize() const {
  for (const RankContext& c : contexts_) {
    TPD_CUDA(cudaSetDevice(c.device));
    TPD_CUDA(cudaStreamSynchronize(c.stream));
  }
}

void Team::reset() {
  synchronize();
  barrier();  // no peer may still be pushing into a buffer we refill
  for (const SymmetricBuffer& b : buffers_) {
    for (std::size_t i = 0; i < contexts_.size(); ++i) {
      TPD_CUDA(cudaSetDevice(contexts_[i].device));
      fill_words(b.local_[i], b.bytes_ / 4, b.fill_word_, contexts_[i].stream);
    }
  }
  synchronize();
  std::memset(errors_host_, 0, sizeof(MailboxError) * contexts_.size());
  barrier();
}

}  // namespace tpdecode
