// NCCL team (NCCL >= 2.28.9 with the symmetric-window device API).
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>

#include "core/check.hpp"
#include "team/lsa_pointers.hpp"
#include "team/rank_context.hpp"
#include "tpdecode/device_buffer.hpp"
#include "tpdecode/nccl_team.hpp"

namespace tpdecode {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void throw_nccl(ncclResult_t r, const char* expr) {
  throw Error(fmt::format("NCCL error {} ({}) in {}", static_cast<int>(r), ncclGetErrorString(r), expr));
}
// Non-blocking communicators answer ncclInProgress while an operation settles.
void check_nccl(ncclResult_t r, const char* expr) {
  if (r != ncclSuccess && r != ncclInProgress) throw_nccl(r, expr);
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

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

int comm_rank(ncclComm* comm) {
  int r = 0;
  TPD_NCCL(ncclCommUserRank(comm, &r));
  return r;
}

int comm_size(ncclComm* comm) {
  check(comm != nullptr, "NcclTeam: null communicator");
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
  // Why the same release (major.minor): the device API is compiled in from the headers
  // (ncclDevComm, the window that ncclGetLsaPointer reads), and releases change those
  // structs: another runtime would read or write them at other offsets.
  if (!nccl_versions_match(v, NCCL_VERSION_CODE)) {
    if (why)
      *why = fmt::format(
          "NCCL runtime {} is another release than the {} tpdecode was built against (the device API's structs "
          "differ between releases): build with NCCL_ROOT at the NCCL that runs, or run with the one it was built "
          "against",
          v, NCCL_VERSION_CODE);
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

NcclTeam::NcclTeam(ncclComm* parent, int device, const TeamOptions& options) : Team(comm_size(parent), options) {
  keep_multicast_off();
  std::string why;
  if (!nccl_team_available(&why)) throw Unavailable(why);
  TPD_CUDA(cudaSetDevice(device));
  const int rank = comm_rank(parent);
  ncclConfig_t config = nonblocking_config();
  TPD_NCCL(ncclCommSplit(parent, 0, rank, &comm_, &config));
  init(rank, device);
}

NcclTeam::NcclTeam(const NcclUniqueId& id, int rank, int size, int device, const TeamOptions& options)
    : Team(size, options) {
  check(rank >= 0 && rank < size, "NcclTeam: rank {} outside [0, {})", rank, size);
  keep_multicast_off();
  std::string why;
  if (!nccl_team_available(&why)) throw Unavailable(why);
  TPD_CUDA(cudaSetDevice(device));
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof nid);
  ncclConfig_t config = nonblocking_config();
  TPD_NCCL(ncclCommInitRankConfig(&comm_, size, nid, rank, &config));
  init(rank, device);
}

void NcclTeam::init(int rank, int device) {
  try {
    settle("communicator creation", barrier_limit());
    // The mailboxes need every rank reachable by loads and stores (one NVLink domain).
    const int lsa_size = lsa_team_size(comm_, [this](const char* what) { settle(what, barrier_limit()); });
    RankContext c;
    c.rank = rank;
    c.device = device;
    c.ranks_on_device = 1;
    TPD_CUDA(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
    TPD_CUDA(cudaMalloc(&barrier_word_, sizeof(int)));
    init_contexts({c}, lsa_size == size());
  } catch (...) {
    if (comm_) ncclCommAbort(comm_);  // the destructor does not run for a failed constructor
    comm_ = nullptr;
    throw;
  }
}

NcclTeam::~NcclTeam() {
  cudaSetDevice(device());
  if (comm_ && std::uncaught_exceptions() > 0) {
    // Why: window deregistration and ncclCommDestroy wait for every rank; a rank
    // that leaves by an exception aborts instead, so it is reported, not hung.
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  if (!comm_) windows_.clear();  // the abort released the windows; the memory stays until exit
  cudaStreamSynchronize(stream());
  release_all();
  cudaFree(barrier_word_);
  cudaStreamDestroy(stream());
  if (comm_) {
    ncclCommFinalize(comm_);
    const auto until = Clock::now() + barrier_limit();
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress && Clock::now() < until) ncclCommGetAsyncError(comm_, &state);
    if (state == ncclSuccess)
      ncclCommDestroy(comm_);
    else
      ncclCommAbort(comm_);
  }
}

std::string NcclTeam::describe() const {
  return fmt::format("NCCL team: rank {} of {} on GPU {}{}", rank(), size(), device(),
                     shares_memory() ? "" : " (ranks do not share memory: every collective runs through NCCL)");
}

void NcclTeam::abort_comm(const std::string& why) const {
  if (comm_) ncclCommAbort(comm_);
  comm_ = nullptr;
  throw TeamBroken(fmt::format("{}; tpdecode's NCCL communicator was aborted and the team is unusable (build a new "
                               "one; a communicator you passed in was never used and is unaffected)",
                               why));
}

ncclComm* NcclTeam::live_comm() const {
  if (!comm_) throw TeamBroken("the team's NCCL communicator was aborted earlier; build a new team");
  return comm_;
}

void NcclTeam::settle(const char* what, std::chrono::milliseconds limit) const {
  live_comm();
  const auto until = Clock::now() + limit;
  while (true) {
    ncclResult_t state = ncclSuccess;
    TPD_NCCL(ncclCommGetAsyncError(comm_, &state));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) abort_comm(fmt::format("NCCL {}: {}", what, ncclGetErrorString(state)));
    if (Clock::now() > until) abort_comm(fmt::format("NCCL {} did not complete within {} ms", what, limit.count()));
    std::this_thread::yield();
  }
}

void NcclTeam::allocate_symmetric(std::size_t bytes, std::vector<void*>& local, std::vector<PeerPointers>& peers) {
  TPD_CUDA(cudaSetDevice(device()));
  // Why: windows are registered in units of NCCL_WIN_REQUIRED_ALIGNMENT.
  const std::size_t padded =
      (bytes + NCCL_WIN_REQUIRED_ALIGNMENT - 1) / NCCL_WIN_REQUIRED_ALIGNMENT * NCCL_WIN_REQUIRED_ALIGNMENT;
  void* buffer = nullptr;
  TPD_NCCL(ncclMemAlloc(&buffer, padded));
  ncclWindow_t window = nullptr;
  TPD_NCCL(ncclCommWindowRegister(live_comm(), buffer, padded, &window, NCCL_WIN_COLL_SYMMETRIC));
  settle("window registration", barrier_limit());
  peers[0] = read_lsa_pointers(window, size(), stream());
  // Why: NCCL maps every rank's copy into one flat range; the own entry there is
  // an alias of `buffer` (same memory, another address). Kernels use the table.
  local[0] = buffer;
  windows_.emplace_back(buffer, window);
}

void NcclTeam::free_symmetric(const std::vector<void*>& local) {
  // A buffer not in windows_ belonged to an aborted communicator: left to the process.
  for (auto it = windows_.begin(); it != windows_.end(); ++it) {
    if (it->first != local[0]) continue;
    if (comm_) {
      ncclCommWindowDeregister(comm_, static_cast<ncclWindow_t>(it->second));
      ncclResult_t state = ncclInProgress;
      const auto until = Clock::now() + barrier_limit();
      while (state == ncclInProgress && Clock::now() < until) ncclCommGetAsyncError(comm_, &state);
    }
    ncclMemFree(it->first);
    windows_.erase(it);
    return;
  }
}

void NcclTeam::await_peers(const char* what, Clock::time_point until, std::chrono::milliseconds limit) {
  // Why the time left, not `limit`: the enqueue's settle and the stream share one deadline.
  settle(what, std::max(std::chrono::milliseconds(0),
                        std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now())));
  while (true) {
    const cudaError_t e = cudaStreamQuery(stream());
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) TPD_CUDA(e);
    if (Clock::now() > until)
      abort_comm(fmt::format("rank {}: a {} waited more than {} ms for its peers", rank(), what, limit.count()));
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclTeam::barrier(std::chrono::milliseconds limit) {
  // A one-word all-reduce on this rank's stream, done once every rank got here.
  const auto until = Clock::now() + limit;
  TPD_NCCL(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, live_comm(), stream()));
  await_peers("barrier", until, limit);
}

void NcclTeam::gather_host(const void* mine, std::size_t bytes, void* all, std::chrono::milliseconds limit) {
  const auto until = Clock::now() + limit;
  TPD_CUDA(cudaSetDevice(device()));
  DeviceBuffer words(bytes * static_cast<std::size_t>(size() + 1));  // [size] gathered, then this rank's
  char* own = words.as<char>() + bytes * static_cast<std::size_t>(size());
  TPD_CUDA(cudaMemcpyAsync(own, mine, bytes, cudaMemcpyHostToDevice, stream()));
  TPD_NCCL(ncclAllGather(own, words.get(), bytes, ncclUint8, live_comm(), stream()));
  await_peers("host gather", until, limit);
  TPD_CUDA(cudaMemcpyAsync(all, words.get(), bytes * static_cast<std::size_t>(size()), cudaMemcpyDeviceToHost,
                           stream()));
  TPD_CUDA(cudaStreamSynchronize(stream()));
}

void NcclTeam::on_stuck(int, const std::string& what) { abort_comm(what); }

void NcclTeam::all_reduce_bf16(const void* in, void* out, std::size_t count, cudaStream_t stream) const {
  TPD_NCCL(ncclAllReduce(in, out, count, ncclBfloat16, ncclSum, live_comm(), stream));
  settle("all-reduce", default_limit());
}

void NcclTeam::all_gather_bytes(const void* in, void* out, std::size_t bytes_per_rank, cudaStream_t stream) const {
  TPD_NCCL(ncclAllGather(in, out, bytes_per_rank, ncclUint8, live_comm(), stream));
  settle("all-gather", default_limit());
}

void NcclTeam::broadcast_bytes(void* data, std::size_t bytes, cudaStream_t stream) const {
  TPD_NCCL(ncclBroadcast(data, data, bytes, ncclUint8, 0, live_comm(), stream));
  settle("broadcast", default_limit());
}

GemmAgreement NcclTeam::gemm_agreement() {
  static_assert(std::is_trivially_copyable_v<GemmDecision>);
  return [this](const GemmKey&, const GemmDecision& local) {
    DeviceBuffer word(sizeof(GemmDecision));
    GemmDecision agreed = local;
    TPD_CUDA(cudaMemcpyAsync(word.get(), &local, sizeof local, cudaMemcpyHostToDevice, stream()));
    broadcast_bytes(word.get(), sizeof local, stream());
    TPD_CUDA(cudaMemcpyAsync(&agreed, word.get(), sizeof agreed, cudaMemcpyDeviceToHost, stream()));
    synchronize();  // bounded: a rank that never gets here aborts the communicator
    return agreed;
  };
}

void NcclTeam::run_threads(const std::vector<int>& devices, const std::function<void(NcclTeam&)>& fn,
                           const TeamOptions& options) {
  const int n = static_cast<int>(devices.size());
  check(supported_team_size(n), "team size {} is not supported", n);
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
