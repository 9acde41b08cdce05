// Checks of the drafter step's math on the CPU reference (cpu_reference.hpp): what
// `tpdecode drafter` runs without a GPU and what the CPU tests assert.
#pragma once

#include <string>
#include <vector>

#include "drafter/config.hpp"
#include "drafter/weights.hpp"

namespace tpdecode::drafter {

struct CheckResult {
  std::string name;
  bool pass = false;
  std::string detail;  // what was measured
};

// Runs the reduced CPU step (twice) for `rows` rows of `config` and checks:
// determinism (bitwise), the argmax rule, the final norm's RMS, hand-recomputed
// logits and attention outputs, the op counts of the full configuration, and that
// every linear's shards at TP 2, 4, 8 tile the TP 1 weight.
std::vector<CheckResult> check_cpu_reference(const DrafterConfig& config, int rows);

// Whether rank shards of `id` at team size tp put together (rows for column-parallel
// and vocabulary-parallel, columns for row-parallel) equal the TP 1 tensor.
bool shards_tile_weight(const DrafterConfig& config, WeightId id, int tp);

}  // namespace tpdecode::drafter
