// The stock path's kernels: a plain rank-order reduce of staged partials, the
// separate add-RMSNorm (row_norm.cuh: ArNorm's math and order, so the same bits)
// and the gather's [TP, rows, S] -> [rows, TP·S] copy.
#include "comm/protocol.hpp"
#include "comm/row_norm.cuh"
#include "core/launch.cuh"
#include "core/rank_switch.hpp"

namespace tpdecode {
namespace {

using lamport::Fragment;

constexpr int kThreads = 256;

// Why clean the partials: the mailbox paths send them cleaned, so the stock path's
// sum is the one-shot's.
template <int kRanks>
__global__ void __launch_bounds__(kThreads) stock_reduce_kernel(PeerPointers src, long src_row_bytes, Fragment* out,
                                                                int frags, bool clean_sum) {
  const int frag = blockIdx.x * kThreads + threadIdx.x;
  const int row = blockIdx.y;
  if (frag >= frags) return;
  Fragment raw[kRanks];
#pragma unroll
  for (int r = 0; r < kRanks; ++r)
    raw[r] = lamport::clean(
        *reinterpret_cast<const Fragment*>(static_cast<const char*>(src.base[r]) + row * src_row_bytes + frag * 16L));
  const Fragment sum = lamport::sum_rank_order<kRanks>(raw);
  out[static_cast<long>(row) * frags + frag] = clean_sum ? lamport::clean(sum) : sum;
}

__global__ void __launch_bounds__(kArNormMaxThreads) add_rms_norm_kernel(const NormIo p) {
  __shared__ rownorm::RowSumShared shared;
  dev::pdl_launch_dependents();
  dev::pdl_wait();
  rownorm::cluster_arrive_started();
  const ArNormTail& t = p.norm;
  rowquant::RowStore store{t.quant};
  store.load();
  const int frags_per_cta = p.hidden / (8 * kArNormCtas);
  const bool active = static_cast<int>(threadIdx.x) < frags_per_cta;
  const int frag = blockIdx.x * frags_per_cta + threadIdx.x;
  const long at = static_cast<long>(blockIdx.y) * (p.hidden / 8) + frag;
  Fragment fresh{};
  Fragment weight{};
  if (active) {
    weight = static_cast<const Fragment*>(t.weight)[frag];
    fresh = static_cast<const Fragment*>(p.reduced)[at];
    if (t.residual) fresh = rownorm::add_residual(fresh, static_cast<const Fragment*>(t.residual)[at]);
    static_cast<Fragment*>(t.residual_out)[at] = fresh;
  }
  const float total = rownorm::cluster_row_sum(rownorm::thread_squares(fresh), shared);
  store.store(t.out, at, rownorm::normed(fresh, weight, rownorm::rstd(total, p.hidden, t.eps)), active);
}

__global__ void __launch_bounds__(kThreads) gather_copy_kernel(PeerPointers src, long src_row_bytes, uint32_t* out,
                                                               int size, int shard_words, bool clean) {
  const int word = blockIdx.x * kThreads + threadIdx.x;
  const int row = blockIdx.y;
  if (word >= size * shard_words) return;
  const int r = word / shard_words;
  const auto* from = reinterpret_cast<const uint32_t*>(static_cast<const char*>(src.base[r]) + row * src_row_bytes);
  const uint32_t w = from[word - r * shard_words];
  out[static_cast<long>(row) * size * shard_words + word] = clean ? lamport::clean(w) : w;
}

unsigned blocks_for(long n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

void launch_stock_reduce(cudaStream_t stream, int size, const PeerPointers& src, long src_row_bytes, void* out,
                         int rows, int width, bool clean_sum) {
  LaunchShape s;
  const int frags = width / 8;
  s.grid = dim3(blocks_for(frags), static_cast<unsigned>(rows));
  s.block = dim3(kThreads);
  with_rank_count(size, [&](auto ranks) {
    launch_kernel(stock_reduce_kernel<decltype(ranks)::value>, s, stream, src, src_row_bytes,
                  static_cast<Fragment*>(out), frags, clean_sum);
  });
}

void launch_add_rms_norm(cudaStream_t stream, const NormIo& io, int rows, bool pdl) {
  LaunchShape s;
  s.pdl = pdl;
  s.grid = dim3(kArNormCtas, static_cast<unsigned>(rows));
  s.block = dim3(static_cast<unsigned>(ar_norm_threads(io.hidden)));
  s.cluster = kArNormCtas;
  launch_kernel(add_rms_norm_kernel, s, stream, io);
}

void launch_gather_copy(cudaStream_t stream, int size, const PeerPointers& src, long src_row_bytes, void* out, int rows,
                        long shard_bytes, bool clean) {
  LaunchShape s;
  const int shard_words = static_cast<int>(shard_bytes / 4);
  s.grid = dim3(blocks_for(static_cast<long>(size) * shard_words), static_cast<unsigned>(rows));
  s.block = dim3(kThreads);
  launch_kernel(gather_copy_kernel, s, stream, src, src_row_bytes, static_cast<uint32_t*>(out), size, shard_words,
                clean);
}

}  // namespace tpdecode
