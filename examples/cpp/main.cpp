// Using tpdecode from an engine's own code, on one GPU: a local team of 2 ranks
// all-reduces on the caller's streams, and a DecodeGemm runs a decode GEMM. Without
// a GPU it says so and exits 0 (so CI can build and run it).
#include <tpdecode/tpdecode.hpp>

#include <cstdio>
#include <vector>

int main() {
  using namespace tpdecode;
  std::string why;
  if (visible_gpu_count(&why) == 0) {
    std::printf("tpdecode %s: no GPU (%s); nothing to run\n", version(), why.c_str());
    return 0;
  }
  constexpr int kRanks = 2, kRows = 4, kHidden = 4096, kN = 1024;
  LocalTeam team(kRanks);
  TpComm comm(team);  // collective; before any graph capture

  std::vector<cudaStream_t> streams;
  std::vector<DeviceBuffer> x, out;
  std::vector<AllReduceIo> io;
  for (int r = 0; r < kRanks; ++r) {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);  // the engine's own streams
    streams.push_back(s);
    x.emplace_back(kRows * kHidden * 2);
    out.emplace_back(kRows * kHidden * 2);
    cudaMemsetAsync(x.back().get(), 0x3f, x.back().bytes(), s);  // the engine's activations: bf16 0x3f3f (~0.75)
    io.push_back({TensorView::bf16(x.back().get(), kRows, kHidden), TensorView::bf16(out.back().get(), kRows, kHidden)});
  }
  const CommResult r = comm.all_reduce(io, streams);  // one call for every rank this object drives
  std::printf("all_reduce: %s%s%s\n", comm_path_name(r.path), r.why.empty() ? "" : ": ", r.why.c_str());

  DeviceBuffer w(static_cast<std::size_t>(kN) * kHidden * 2), y(kRows * kN * 2);
  cudaMemsetAsync(w.get(), 0x3c, w.bytes(), streams[0]);  // every weight bf16 0x3c3c (about 0.0115)
  DecodeGemm gemm(TensorView::bf16(w.get(), kN, kHidden));
  const GemmPath p = gemm.run(TensorView::bf16(out[0].get(), kRows, kHidden), TensorView::bf16(y.get(), kRows, kN),
                              streams[0]);
  team.synchronize();  // bounded wait; raises TimeoutError if any rank failed
  std::printf("decode gemm: %s\n", gemm_path_name(p));
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
  return 0;
}
