// The stock path's kernels: a plain rank-order reduce, the separate add-RMSNorm
// (row_norm.cuh: ArNorm's math) and the gather's [TP, rows, S] -> [rows, TP·S] copy.
#include "comm/row_norm.cuh"
#include "comm/stock_comm_launch.hpp"
#include "core/launch.cuh"
#include "core/rank_switch.hpp"

namespace tpdecode {

namespace {

constexpr int kStockThreads = 256;

template <int kRanks>
__global__ void __launch_bounds__(kStockThreads) stock_reduce_kernel(PeerPointers src, long src_row_bytes,
                                                                     lamport::Fragment* reduced, int frags) {
  using namespace lamport;
  const int frag = blockIdx.x * kStockThreads + threadIdx.x;
  const int row = blockIdx.y;
  if (frag >= frags) return;
  Fragment raw[kRanks];
#pragma unroll
  for (int r = 0; r < kRanks; ++r)
    raw[r] = load_fragment(static_cast<const char*>(src.base[r]) + row * src_row_bytes + frag * 16L);
  reduced[static_cast<long>(row) * frags + frag] = sum_rank_order<kRanks>(raw);
}

struct NormParams {
  const void* reduced;   // [rows, hidden] bf16
  const void* residual;  // [rows, hidden] bf16 or nullptr
  const void* weight;    // [hidden] bf16
  void* out;             // [rows, hidden] bf16
  void* residual_out;    // [rows, hidden] bf16
  float eps;
  int hidden;
};

__global__ void __launch_bounds__(rownorm::kMaxWarps * 32) add_rms_norm_kernel(NormParams p) {
  using namespace lamport;
  __shared__ rownorm::RowSumShared shared;
  rownorm::cluster_arrive_started();
  const int frags_per_cta = p.hidden / (8 * kArNormCtas);
  const bool active = static_cast<int>(threadIdx.x) < frags_per_cta;
  const int frag = blockIdx.x * frags_per_cta + threadIdx.x;
  const long at = static_cast<long>(blockIdx.y) * (p.hidden / 8) + frag;
  Fragment fresh{};
  Fragment weight{};
  if (active) {
    weight = load_fragment(static_cast<const Fragment*>(p.weight) + frag);
    fresh = load_fragment(static_cast<const Fragment*>(p.reduced) + at);
    if (p.residual) fresh = rownorm::add_residual(fresh, load_fragment(static_cast<const Fragment*>(p.residual) + at));
    store_fragment(static_cast<Fragment*>(p.residual_out) + at, fresh);
  }
  const float total = rownorm::cluster_row_sum(rownorm::thread_squares(fresh), shared);
  if (active)
    store_fragment(static_cast<Fragment*>(p.out) + at, rownorm::normed(fresh, weight, rownorm::rstd(total, p.hidden, p.eps)));
}

__global__ void __launch_bounds__(kStockThreads) gather_copy_kernel(PeerPointers src, long src_row_bytes, uint32_t* out,
                                                                   int size, int shard_words) {
  const int word = blockIdx.x * kStockThreads + threadIdx.x;
  const int row = blockIdx.y;
  if (word >= size * shard_words) return;
  const int r = word / shard_words;
  const auto* from = reinterpret_cast<const uint32_t*>(static_cast<const char*>(src.base[r]) + row * src_row_bytes);
  out[static_cast<long>(row) * size * shard_words + word] = from[word - r * shard_words];
}

unsigned blocks_for(long n) { return static_cast<unsigned>((n + kStockThreads - 1) / kStockThreads); }

}  // namespace

void launch_stock_reduce(cudaStream_t stream, int size, const PeerPointers& src, long src_row_bytes, void* reduced,
                         int rows, int hidden) {
  LaunchShape s;
  const int frags = hidden / 8;
  s.grid = dim3(blocks_for(frags), static_cast<unsigned>(rows));
  s.block = dim3(kStockThreads);
  with_rank_count(size, [&](auto ranks) {
    launch_kernel(stock_reduce_kernel<decltype(ranks)::value>, s, stream, src, src_row_bytes,
                  static_cast<lamport::Fragment*>(reduced), frags);
  });
}

void launch_add_rms_norm(cudaStream_t stream, const void* reduced, const ArNormIo& io) {
  LaunchShape s;
  s.grid = dim3(kArNormCtas, static_cast<unsigned>(io.x.rows));
  s.block = dim3(static_cast<unsigned>(ar_norm_threads(io.x.cols)));
  s.cluster = kArNormCtas;
  NormParams p{reduced, io.residual.data, io.weight.data, io.out.data, io.residual_out.data, io.eps,
               static_cast<int>(io.x.cols)};
  launch_kernel(add_rms_norm_kernel, s, stream, p);
}

void launch_gather_copy(cudaStream_t stream, int size, const PeerPointers& src, long src_row_bytes, void* out,
                        int rows, long shard_bytes) {
  LaunchShape s;
  const int shard_words = static_cast<int>(shard_bytes / 4);
  s.grid = dim3(blocks_for(static_cast<long>(size) * shard_words), static_cast<unsigned>(rows));
  s.block = dim3(kStockThreads);
  launch_kernel(gather_copy_kernel, s, stream, src, src_row_bytes, static_cast<uint32_t*>(out), size, shard_words);
}

}  // namespace tpdecode
