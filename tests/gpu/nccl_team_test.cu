// The NCCL team on the GPUs this machine has (one GPU: a 1-rank smoke test of the
// window, the peer address and a stock all-reduce; more GPUs: every rank).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "gpu/gpu_test_util.hpp"
#include "tpdecode/all_reduce.hpp"
#include "tpdecode/nccl_team.hpp"
#include "reference/all_reduce.hpp"

namespace tpdecode {
namespace {

std::vector<int> all_devices() {
  int n = 0;
  TPD_CUDA(cudaGetDeviceCount(&n));
  int size = 1;
  while (size * 2 <= n && size * 2 <= kMaxRanks) size *= 2;
  std::vector<int> d;
  for (int i = 0; i < size; ++i) d.push_back(i);
  return d;
}

TEST(NcclTeam, WindowPeerAddressesStockAndMailboxAllReduce) {
  TPD_REQUIRE_GPU();
  std::string why;
  if (!nccl_team_available(&why)) GTEST_SKIP() << why;
  const std::vector<int> devices = all_devices();
  const int ranks = static_cast<int>(devices.size());
  constexpr int kRows = 3, kHidden = 7168;
  std::mt19937_64 rng(test::fresh_seed());
  std::vector<std::vector<uint16_t>> partials;
  for (int r = 0; r < ranks; ++r) partials.push_back(test::random_bf16(kRows * kHidden, rng));
  const std::vector<uint16_t> ref = reference::all_reduce(partials);
  // EXPECT, not ASSERT, inside the rank threads: a rank that returned early would
  // skip the collective calls its peers wait in.
  NcclTeam::run_threads(devices, [&](NcclTeam& team) {
    const int rank = team.rank();
    // A symmetric buffer filled with the word; the peer table's own entry is an
    // alias of the local buffer (NCCL's flat mapping): a write through one is seen
    // through the other.
    SymmetricBuffer b = team.allocate(4096, 0x12345678u);
    for (int p = 0; p < ranks; ++p) EXPECT_NE(b.peers(0).base[p], nullptr);
    std::vector<uint32_t> words(1024);
    TPD_CUDA(cudaMemcpy(words.data(), b.peers(0).base[rank], 4096, cudaMemcpyDeviceToHost));
    for (uint32_t w : words) EXPECT_EQ(w, 0x12345678u);
    const uint32_t mark = 0xC0FFEE00u + static_cast<uint32_t>(rank);
    TPD_CUDA(cudaMemcpy(b.local(0), &mark, 4, cudaMemcpyHostToDevice));
    uint32_t seen = 0;
    TPD_CUDA(cudaMemcpy(&seen, b.peers(0).base[rank], 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(seen, mark);
    team.reset();  // refills the word
    // The stock all-reduce on the same communicator.
    test::DeviceBuffer x = test::to_device(partials[static_cast<std::size_t>(rank)]);
    test::DeviceBuffer out(kRows * kHidden * 2);
    test::poison(out);
    TPD_CUDA(cudaDeviceSynchronize());
    team.all_reduce_bf16(x.get(), out.get(), kRows * kHidden, team.rank_context(0).stream);
    TPD_CUDA(cudaStreamSynchronize(team.rank_context(0).stream));
    const std::vector<uint16_t> stock = test::to_host<uint16_t>(out, ref.size());
    if (ranks == 1) EXPECT_EQ(stock, partials[0]);
    // The mailbox all-reduce over the NCCL window: bitwise the reference.
    Mailbox box(team, all_reduce_mailbox_shape(ranks, 8, kHidden));
    for (int parity : {0, 1}) {
      test::poison(out);
      TPD_CUDA(cudaDeviceSynchronize());
      all_reduce(team.rank_context(0), box.view(0, parity), TensorView::bf16(x.get(), kRows, kHidden),
                 TensorView::bf16(out.get(), kRows, kHidden));
      team.synchronize();
      team.check_errors();
      EXPECT_EQ(test::to_host<uint16_t>(out, ref.size()), ref) << "rank " << rank << " parity " << parity;
    }
  });
}

}  // namespace
}  // namespace tpdecode
