// Who the TP ranks are, and symmetric memory: buffers of the same size on every
// rank, each rank holding the addresses of its peers' copies.
//
// A Team object is what one host thread drives. The local team drives every rank
// (N emulated ranks on one GPU, one stream each); an NCCL team object drives one
// rank of a communicator (one thread or process per GPU). Collectives are launched
// per driven rank: `for (int i = 0; i < team.driven(); ++i) op(team.rank_context(i), ...)`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tpdecode/mailbox_error.hpp"

namespace tpdecode {

inline constexpr int kMaxRanks = 16;

// Team sizes the kernels are compiled for (a 1/2/4/8/16 switch).
constexpr bool supported_team_size(int n) { return n == 1 || n == 2 || n == 4 || n == 8 || n == 16; }

// Every rank's copy of one symmetric buffer, as a kernel parameter (passed by value:
// no device table load on the critical path). base[r] is rank r's copy.
struct PeerPointers {
  void* base[kMaxRanks] = {};
};

// What a kernel launcher needs to know about the rank it launches for.
struct RankContext {
  int rank = 0;
  int size = 1;
  int device = 0;
  cudaStream_t stream = nullptr;
  // Ranks whose spin-waiting kernels share this GPU (the local team: all of them).
  // Launchers refuse a grid that could not be resident ranks_on_device times over.
  int ranks_on_device = 1;
  // Poll deadline of every bounded wait, in nanoseconds.
  uint64_t timeout_ns = 0;
  // This rank's error record (host-mapped: the host reads it without a sync).
  MailboxError* error_device = nullptr;
  const volatile MailboxError* error_host = nullptr;
  // Programmatic dependent launch for the collectives' kernels.
  bool pdl = true;
};

enum class TeamKind { kLocal, kNccl };

class Team;

// One symmetric allocation, seen from every rank this object drives.
class SymmetricBuffer {
 public:
  SymmetricBuffer() = default;
  std::size_t bytes() const { return bytes_; }
  // Own copy of driven rank i.
  void* local(int i) const { return local_.at(static_cast<std::size_t>(i)); }
  // Every rank's copy, as seen by driven rank i.
  const PeerPointers& peers(int i) const { return peers_.at(static_cast<std::size_t>(i)); }
  uint32_t fill_word() const { return fill_word_; }
  explicit operator bool() const { return bytes_ != 0; }

 private:
  friend class Team;
  std::size_t bytes_ = 0;
  uint32_t fill_word_ = 0;
  std::vector<void*> local_;
  std::vector<PeerPointers> peers_;
};

struct TeamOptions {
  // Poll deadline; 0 reads TPDECODE_TIMEOUT_MS or takes the default (5 s).
  uint64_t timeout_ms = 0;
  bool pdl = true;
};

class Team {
 public:
  virtual ~Team();
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;

  virtual TeamKind kind() const = 0;
  virtual std::string describe() const = 0;
  int size() const { return size_; }
  // Ranks this object drives, and their contexts.
  int driven() const { return static_cast<int>(contexts_.size()); }
  const RankContext& rank_context(int i) const { return contexts_.at(static_cast<std::size_t>(i)); }
  uint64_t timeout_ns() const { return timeout_ns_; }

  // Collective: a buffer of `bytes` (rounded up to 16) on every rank, every 32-bit
  // word set to `fill_word`. Call in the same order on every rank; never during
  // stream capture. The team keeps it until destroyed and refills it on reset().
  SymmetricBuffer allocate(std::size_t bytes, uint32_t fill_word);

  // Throws TimeoutError (naming rank, op, parity, slot) if any driven rank's
  // kernel recorded a missed deadline. Cheap: reads host-mapped memory, no sync.
  void check_errors() const;
  bool has_error() const;

  // Collective: waits for the driven ranks' streams, refills every symmetric
  // buffer with its fill word (re-arms every mailbox), clears the error records
  // and synchronises the ranks. After a timeout this makes the team usable again.
  void reset();

  // Waits for every driven rank's stream.
  void synchronize() const;

 protected:
  Team(int size, const TeamOptions& options);
  // Backend: allocate `bytes` on every driven rank and fill peers (already zeroed).
  virtual void allocate_symmetric(std::size_t bytes, std::vector<void*>& local,
                                  std::vector<PeerPointers>& peers) = 0;
  virtual void free_symmetric(const std::vector<void*>& local) = 0;
  // Backend: make every rank's fills visible before any rank goes on.
  virtual void barrier() = 0;
  // Called by the backend's constructor once the driven ranks are known.
  void init_contexts(std::vector<RankContext> contexts);
  // Called by the backend's destructor: frees what allocate() made.
  void release_all();

 private:
  int size_;
  uint64_t timeout_ns_;
  bool pdl_;
  std::vector<RankContext> contexts_;
  MailboxError* errors_host_ = nullptr;  // [driven] host-mapped
  std::vector<SymmetricBuffer> buffers_;
};

// Number of CTAs of `kernel` (with `block` threads, `smem` dynamic bytes and
// `cluster` CTAs per cluster) that one device can hold at once.
int resident_ctas(const void* kernel, int block, std::size_t smem, int cluster, int device);

// CTAs of `kernel` one rank may launch at once: the device's capacity shared by
// the ctx.ranks_on_device ranks on it. Why the margin: for clusters on a shared GPU
// (the local team) only half of that, because the occupancy query counts an empty
// GPU with ideal GPC packing, while the ranks' clusters arrive at different times
// around other kernels (local TP 8 ArNorm timed out at 14 rows of a 15-row rule).
int coresident_ctas_per_rank(const RankContext& ctx, const void* kernel, int block, std::size_t smem,
                             int cluster = 1);

// Throws CapacityError unless a grid of `grid_ctas` CTAs fits the rank's budget
// (coresident_ctas_per_rank): spin-waiting CTAs of all ranks must be co-resident.
void require_coresident(const RankContext& ctx, const char* op, const void* kernel, long grid_ctas,
                        int block, std::size_t smem, int cluster = 1);

// Default poll deadline (TPDECODE_TIMEOUT_MS, else 5000 ms).
uint64_t default_timeout_ms();

}  // namespace tpdecode
