// Helpers of the ArNorm / Gather / DrafterComm GPU tests: per-rank inputs and
// outputs on a local team, and their CPU references.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "gpu/gpu_test_util.hpp"
#include "tpdecode/ar_norm.hpp"
#include "reference/ar_norm.hpp"
#include "tpdecode/team.hpp"

namespace tpdecode::test {

inline bool quick() { return std::getenv("TPDECODE_QUICK") != nullptr; }

// One ArNorm call's tensors on every rank: a partial per rank, the residual and the
// weight replicated (as in a TP model), poisoned outputs.
struct ArNormCase {
  int ranks = 0, rows = 0, hidden = 0;
  bool residual = true;
  float eps = 1e-6f;
  std::vector<std::vector<uint16_t>> x_host;  // [rank][rows · hidden]
  std::vector<uint16_t> residual_host;        // [rows · hidden] (empty: none)
  std::vector<uint16_t> weight_host;          // [hidden]
  std::vector<DeviceBuffer> x, res, out, res_out;
  DeviceBuffer weight;

  ArNormIo io(int rank) const;
  reference::ArNormResult reference() const;
};

// Random data, with sentinel words (BF16 pair +0, -0) planted in every partial.
ArNormCase make_ar_norm_case(int ranks, int rows, int hidden, bool residual, std::mt19937_64& rng);

// Outcome of comparing every rank's outputs with the reference.
struct ArNormCheck {
  long residual_mismatches = 0;  // must be 0 (bitwise)
  long out_over_one_ulp = 0;     // must be 0
  long out_exact = 0, out_total = 0;
  long ranks_differing = 0;      // ranks whose outputs differ from rank 0's (must be 0)
};
ArNormCheck check_ar_norm(const ArNormCase& c);

// Random 32-bit words with planted sentinel words.
std::vector<uint32_t> random_words(std::size_t n, std::mt19937_64& rng);

}  // namespace tpdecode::test
