// NCCL team (NCCL >= 2.28.9 with the symmetric-window device API).
#include "team/lsa_pointers.hpp"
#include <nccl.h>

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "tpdecode/error.hpp"
#include "tpdecode/nccl_team.hpp"

namespace tpdecode {
namespace {

void check_nccl(ncclResult_t r, const char* expr) {
  if (r != ncclSuccess) throw Error(fmt::format("NCCL error {} ({}) in {}", static_cast<int>(r), ncclGetErrorString(r), expr));
}
#define TPD_NCCL(expr) check_nccl((expr), #expr)

// Why: NVLink multicast can take a shared host's GPUs down; the peer-store
// transport is the one we run. Set before any communicator exists, never unset.
// Written only when not already "0": rank threads then never write the environment
// while another reads it (run_threads sets it before starting them).
void keep_multicast_off() {
  const char* v = std::getenv("NCCL_NVLS_ENABLE");
  if (v == nullptr || std::strcmp(v, "0") != 0) setenv("NCCL_NVLS_ENABLE", "0", 1);
}

int comm_size(ncclComm* comm) {
  require(comm != nullptr, "NcclTeam: null communicator");
  int n = 0;
  TPD_NCCL(ncclCommCount(comm, &n));
  return n;
}

}  // namespace

bool nccl_team_available(std::string* why) {
  const int v = nccl_runtime_version();
  if (v < 22809) {
    if (why) *why = fmt::format("NCCL runtime {} is older than 2.28.9 (no symmetric-window device API)", v);
    return false;
  }
  return true;
}

int nccl_runtime_version() {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

NcclUniqueId NcclTeam::make_unique_id() {
  keep_multicast_off();
  ncclUniqueId id;
  TPD_NCCL(ncclGetUniqueId(&id));
  NcclUniqueId out;
  static_assert(sizeof(id) == sizeof(out));
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

NcclTeam::NcclTeam(ncclComm* comm, int device, const TeamOptions& options)
    : Team(comm_size(comm), options), comm_(comm) {
  init(device);
}

NcclTeam::NcclTeam(const NcclUniqueId& id, int rank, int size, int device, const TeamOptions& options)
    : Team(size, options) {
  require(rank >= 0 && rank < size, fmt::format("NcclTeam: rank {} outside [0, {})", rank, size));
  keep_multicast_off();
  TPD_CUDA(cudaSetDevice(device));
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof nid);
  TPD_NCCL(ncclCommInitRank(&comm_, size, nid, rank));
  owns_comm_ = true;
  try {
    init(device);
  } catch (...) {
    ncclCommAbort(comm_);  // the destructor does not run for a failed constructor
    throw;
  }
}

void NcclTeam::init(int device) {
  keep_multicast_off();
  std::string why;
  if (!nccl_team_available(&why)) throw Unavailable(why);
  TPD_CUDA(cudaSetDevice(device));
  int rank = 0;
  TPD_NCCL(ncclCommUserRank(comm_, &rank));
  // The mailboxes need every rank reachable by loads and stores (one NVLink domain).
  const int lsa_size = lsa_team_size(comm_);
  if (lsa_size != size())
    throw Unavailable(fmt::format("NCCL team: only {} of {} ranks share load/store memory (one NVLink domain); "
                                  "the mailbox collectives are not served, use the stock collectives",
                                  lsa_size, size()));
  RankContext c;
  c.rank = rank;
  c.device = device;
  c.ranks_on_device = 1;
  TPD_CUDA(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  init_contexts({c});
  TPD_CUDA(cudaMalloc(&barrier_word_, sizeof(int)));
}

NcclTeam::~NcclTeam() {
  cudaSetDevice(device());
  // Why: window deregistration and ncclCommDestroy wait for every rank, and an NCCL
  // kernel in flight may wait on a peer that is gone; a rank that leaves by an
  // exception aborts its own communicator first (which also ends its NCCL kernels),
  // so the failure is reported rather than hanging here.
  if (owns_comm_ && std::uncaught_exceptions() > 0) {
    ncclCommAbort(comm_);
    owns_comm_ = false;
    windows_.clear();  // the abort released the windows; the memory stays until exit
  }
  cudaStreamSynchronize(rank_context(0).stream);
  release_all();
  cudaFree(barrier_word_);
  cudaStreamDestroy(rank_context(0).stream);
  if (owns_comm_) ncclCommDestroy(comm_);
}

std::string NcclTeam::describe() const {
  return fmt::format("NCCL team: rank {} of {} on GPU {}", rank(), size(), device());
}

void NcclTeam::allocate_symmetric(std::size_t bytes, std::vector<void*>& local, std::vector<PeerPointers>& peers) {
  TPD_CUDA(cudaSetDevice(device()));
  // Why: windows are registered in units of NCCL_WIN_REQUIRED_ALIGNMENT.
  const std::size_t padded = (bytes + NCCL_WIN_REQUIRED_ALIGNMENT - 1) / NCCL_WIN_REQUIRED_ALIGNMENT *
                             NCCL_WIN_REQUIRED_ALIGNMENT;
  void* buffer = nullptr;
  TPD_NCCL(ncclMemAlloc(&buffer, padded));
  ncclWindow_t window = nullptr;
  TPD_NCCL(ncclCommWindowRegister(comm_, buffer, padded, &window, NCCL_WIN_COLL_SYMMETRIC));
  peers[0] = read_lsa_pointers(window, size(), rank_context(0).stream);
  // Why: NCCL maps every rank's copy into one flat range; the own entry there is
  // an alias of `buffer` (same memory, another address). Kernels use the table.
  local[0] = buffer;
  windows_.emplace_back(buffer, window);
}

void NcclTeam::free_symmetric(const std::vector<void*>& local) {
  // A buffer not in windows_ belonged to an aborted communicator: left to the process.
  for (auto it = windows_.begin(); it != windows_.end(); ++it) {
    if (it->first != local[0]) continue;
    ncclCommWindowDeregister(comm_, static_cast<ncclWindow_t>(it->second));
    ncclMemFree(it->first);
    windows_.erase(it);
    return;
  }
}

void NcclTeam::barrier() {
  // A one-word all-reduce on this rank's stream: returns once every rank got here.
  cudaStream_t s = rank_context(0).stream;
  TPD_NCCL(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_, s));
  TPD_CUDA(cudaStreamSynchronize(s));
}

void NcclTeam::all_reduce_bf16(const void* in, void* out, std::size_t count, cudaStream_t stream) const {
  TPD_NCCL(ncclAllReduce(in, out, count, ncclBfloat16, ncclSum, comm_, stream));
}

void NcclTeam::all_gather_bytes(const void* in, void* out, std::size_t bytes_per_rank, cudaStream_t stream) const {
  TPD_NCCL(ncclAllGather(in, out, bytes_per_rank, ncclUint8, comm_, stream));
}

void NcclTeam::run_threads(const std::vector<int>& devices, const std::function<void(NcclTeam&)>& fn,
                           const TeamOptions& options) {
  const int n = static_cast<int>(devices.size());
  require(supported_team_size(n), fmt::format("team size {} is not supported", n));
  const NcclUniqueId id = make_unique_id();
  std::mutex m;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        NcclTeam team(id, r, n, devices[static_cast<std::size_t>(r)], options);
        fn(team);
      } catch (...) {
        std::lock_guard<std::mutex> lock(m);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace tpdecode
