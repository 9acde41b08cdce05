#include "gemm/chain_timing.hpp"

#include <map>
#include <memory>

#include "core/check.hpp"
#include "core/graph_timing.hpp"
#include "core/random_fill.hpp"
#include "tpdecode/decode_gemm.hpp"
#include "tpdecode/device_buffer.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode {

std::size_t fastest_chain_assignment(const std::vector<DecodeGemm*>& links, int m, std::size_t count,
                                     const std::function<void(std::size_t)>& apply, cudaStream_t stream) {
  check(count > 0 && !links.empty() && m >= 1, "chain timing: {} assignments of {} links at {} rows", count,
        links.size(), m);
  TPD_CUDA(cudaStreamSynchronize(stream));
  const TimingStream own;
  std::map<int64_t, DeviceBuffer> xs;  // by K: [m, K] bf16
  std::vector<DeviceBuffer> outs;      // by link: [m, N] bf16
  for (const DecodeGemm* g : links) {
    if (!xs.count(g->k())) {
      xs.emplace(g->k(), DeviceBuffer(static_cast<std::size_t>(m * g->k()) * 2));
      fill_uniform_bf16(xs.at(g->k()).get(), m * g->k(), 0xc4a1, 1.0f, own.get());
    }
    outs.emplace_back(static_cast<std::size_t>(m * g->n()) * 2);
  }
  std::vector<std::unique_ptr<TimedGraph>> graphs;
  for (std::size_t j = 0; j < count; ++j) {
    apply(j);
    graphs.push_back(std::make_unique<TimedGraph>(
        own.get(),
        [&](cudaStream_t st, int) {
          for (std::size_t i = 0; i < links.size(); ++i)
            links[i]->run(TensorView::bf16(xs.at(links[i]->k()).get(), m, links[i]->k()),
                          TensorView::bf16(outs[i].get(), m, links[i]->n()), st);
        },
        1));
  }
  for (int warm = 0; warm < 2; ++warm)
    for (const auto& g : graphs) g->launch(own.get());
  interleave(count, kChainTimingReplays, [&](std::size_t j) { return graphs[j]->time_replay(own.get()); });
  std::size_t best = 0;
  for (std::size_t j = 1; j < count; ++j)
    if (graphs[j]->timing().median_us < graphs[best]->timing().median_us) best = j;
  return best;
}

}  // namespace tpdecode
