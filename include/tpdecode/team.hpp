// Who the TP ranks are, and symmetric memory: buffers of the same size on every
// rank, each rank holding the addresses of its peers' copies.
//
// A Team object is what one host thread drives. The local team drives every rank
// (N emulated ranks on one GPU, one stream each); an NCCL team object drives one
// rank of a communicator (one thread or process per GPU). The collectives
// (comm.hpp) take one call for all the ranks an object drives.
//
// Failure model. Every wait of tpdecode's kernels is bounded (TeamOptions::
// timeout_ms). A rank whose wait expires records the error and aborts the team:
// from then on every rank's calls do nothing but poison their outputs (NaN) and
// report, until reset() on every rank. check_errors() (cheap, local) and
// synchronize() (bounded, also learns of a peer's failure) raise TimeoutError.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tpdecode/gemm_tuner.hpp"

namespace tpdecode {

inline constexpr int kMaxRanks = 16;

// Team sizes the kernels are compiled for.
constexpr bool supported_team_size(int n) { return n == 1 || n == 2 || n == 4 || n == 8 || n == 16; }

struct RankContext;     // per driven rank: what kernel launchers need (private to the library)
class SymmetricBuffer;  // one symmetric allocation (private to the library)
class TpComm;           // comm.hpp
namespace detail {
struct TeamInternals;  // the library's own access to a team (private to the library)
}

// Every rank's copy of one symmetric buffer. base[r] is rank r's copy.
struct PeerPointers {
  void* base[kMaxRanks] = {};
};

enum class TeamKind { kLocal, kNccl };

// The longest deadline a team takes (TeamOptions, or their environment variables):
// a day. More raises InvalidArgument.
inline constexpr uint64_t kMaxDeadlineMs = 24ull * 3600 * 1000;

struct TeamOptions {
  // Deadline of every wait of a kernel; 0 reads TPDECODE_TIMEOUT_MS or takes the
  // default (5 s). At most kMaxDeadlineMs.
  uint64_t timeout_ms = 0;
  // Deadline of the team's barriers (reset(), collective allocations, the NCCL
  // communicator's creation): how long a rank waits for the others to get there; 0
  // reads TPDECODE_BARRIER_TIMEOUT_MS or takes the default (30 s). Under
  // compute-sanitizer NCCL's creation alone can take longer. At most kMaxDeadlineMs.
  uint64_t barrier_timeout_ms = 0;
  // Programmatic dependent launch for tpdecode's kernels.
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
  // Ranks this object drives.
  int driven() const { return static_cast<int>(contexts_.size()); }
  int rank(int driven = 0) const;
  int device(int driven = 0) const;
  // Driven ranks on driven rank 0's GPU, whose kernels run there at once (a local
  // team's: all of them; DecodeGemm::set_sharing).
  int ranks_sharing_gpu() const;
  // A stream the team made for a driven rank (any stream of that device works, one
  // per driven rank: a call given one stream for two, or the legacy default stream
  // where it drives two or more, raises InvalidArgument).
  cudaStream_t stream(int driven = 0) const;
  // Whether every rank reaches every other rank's memory by loads and stores (one
  // GPU, or one NVLink domain): the mailbox collectives need it; without it every
  // collective runs the stock path (NCCL).
  bool shares_memory() const { return shares_memory_; }

  // Throws TimeoutError if a call of a driven rank recorded a timeout or found the
  // team aborted; TeamBroken once the team is broken(). Cheap: reads host-mapped
  // memory, no synchronisation.
  void check_errors() const;
  // Whether the team is unusable for good (the NCCL team once its communicator was
  // aborted): every call, reset() and every new collective object raise TeamBroken;
  // build a new team.
  virtual bool broken() const { return false; }
  bool has_error() const;

  // Waits for every driven rank's stream and for the streams in `also`, at most
  // `limit` (default: the team's timeout plus one second), then raises TimeoutError
  // if any rank of the team failed: also a peer's timeout that no call of this rank
  // has seen yet. `also`: streams of driven rank 0's GPU that the caller's calls (or
  // graphs of them) ran on, where those are not the team's: the team does not see
  // them. A stream that does not drain in time (an NCCL collective waiting on a rank
  // that is gone, a kernel that never ends) raises what a rank recorded (TimeoutError)
  // where one did, else TeamBroken. The NCCL team aborts its communicator first, which
  // ends its kernels, and is broken() from then on: build a new one. A local team is
  // not: once its work has drained, reset() makes it usable again.
  void synchronize(std::chrono::milliseconds limit = std::chrono::milliseconds(0),
                   std::span<const cudaStream_t> also = {});

  // Collective (every rank calls it): waits for the streams and those in `also`
  // (bounded; see synchronize), re-arms every mailbox, clears the abort word and the
  // error records. After a timeout this makes the team usable again. Why `also`
  // matters: a call still queued on a caller's stream would run against the re-armed
  // mailboxes (a stale push that reads as published, or an epoch one ahead of the
  // peers'). Raises TeamBroken where a rank does not arrive within
  // TeamOptions::barrier_timeout_ms.
  void reset(std::span<const cudaStream_t> also = {});

  // What DecodeGemm::set_agreement needs so that every rank of the team runs the
  // same GEMM decisions (replicated GEMMs then stay bitwise identical): rank 0's
  // decision, broadcast, on the NCCL team; empty where the ranks are threads of one
  // process driven by one object (they share one tuner already).
  virtual GemmAgreement gemm_agreement() { return {}; }

 protected:
  Team(int size, const TeamOptions& options);
  // Backend: allocate `bytes` on every driven rank and fill peers.
  virtual void allocate_symmetric(std::size_t bytes, std::vector<void*>& local, std::vector<PeerPointers>& peers) = 0;
  virtual void free_symmetric(const std::vector<void*>& local) = 0;
  // Backend: every rank reaches this point before any goes on, within `limit`;
  // throws TeamBroken otherwise.
  virtual void barrier(std::chrono::milliseconds limit) = 0;
  // Backend: every rank's `bytes` at `mine` gathered into `all` ([size()][bytes],
  // rank order), within `limit`; collective (every rank at the same point; each
  // rank this object drives gives `mine`). Throws TeamBroken where a rank does not
  // arrive.
  virtual void gather_host(const void* mine, std::size_t bytes, void* all, std::chrono::milliseconds limit) = 0;
  // Backend: a driven rank's stream did not drain in time: throws TeamBroken (the
  // NCCL team aborts its communicator first, ending its kernels, and is broken()).
  virtual void on_stuck(int driven, const std::string& what) = 0;
  // Called by the backend's constructor once the driven ranks are known.
  void init_contexts(const std::vector<RankContext>& contexts, bool shares_memory);
  // Called by the backend's destructor: frees what allocate() made.
  void release_all();
  std::chrono::milliseconds default_limit() const;
  std::chrono::milliseconds barrier_limit() const { return barrier_limit_; }

 private:
  friend struct detail::TeamInternals;
  const RankContext& context(int driven) const;
  // Waits for `stream` (of driven rank i's GPU) until `until`; false if it did not drain.
  bool drain(int i, cudaStream_t stream, std::chrono::steady_clock::time_point until) const;
  // Driven rank i's stream and, for rank 0, those in `also`: where one does not
  // drain by `until`, what to report (which rank, which stream); else "".
  std::string undrained(int i, std::span<const cudaStream_t> also, std::chrono::steady_clock::time_point until) const;
  // Whether rank i's control block holds the abort word (read with a copy on a
  // stream of its own, after the rank's stream drained).
  uint32_t read_abort_word(int i) const;

  int size_;
  uint64_t timeout_ns_;
  std::chrono::milliseconds barrier_limit_;
  bool pdl_;
  bool shares_memory_ = false;
  std::vector<std::unique_ptr<RankContext>> contexts_;
  void* errors_host_ = nullptr;  // [driven] ErrorRecord, host-mapped
  int epoch_counters_ = 0;
  // Every symmetric allocation, the control block ([1] lamport::ControlBlock per
  // rank) first. Why a vector of a type declared only: it is complete wherever a
  // member of the vector is used (the library's own code).
  std::vector<SymmetricBuffer> buffers_;
  // The TpComms the library's own objects share (TeamInternals::shared_comm), with
  // their group, released first by release_all().
  std::vector<std::pair<int, std::unique_ptr<TpComm>>> shared_comms_;
};

}  // namespace tpdecode
