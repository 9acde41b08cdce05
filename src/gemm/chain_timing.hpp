// Times alternative decisions of a chain of GEMM links as the chain itself
// (DecodeGemm::decide_adjacent): what the links' separate timings and a boundary
// model cannot see, such as a link whose CTAs outnumber the SMs beside neighbours of
// another shape, shows in the chain's own time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <vector>

namespace tpdecode {

class DecodeGemm;

// The index of the fastest of `count` assignments of decisions to `links` (launched
// back to back in that order, m rows each): before capturing assignment j, `apply(j)`
// sets every link's decision. Each assignment's chain is one CUDA graph (random
// activations per K, an output per link) on a stream of its own, timed interleaved
// with the others (medians of kChainTimingReplays); ties go to the lower index.
// Synchronises `stream` first.
inline constexpr int kChainTimingReplays = 5;
std::size_t fastest_chain_assignment(const std::vector<DecodeGemm*>& links, int m, std::size_t count,
                                     const std::function<void(std::size_t)>& apply, cudaStream_t stream);

}  // namespace tpdecode
