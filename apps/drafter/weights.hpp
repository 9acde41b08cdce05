// The drafter's tensors: which weight is which, how each is sharded over a TP team,
// and the value of every element (weight_hash.hpp), so that the device fill of a
// rank's shard and the host regeneration of the whole tensor agree bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "drafter/config.hpp"

namespace tpdecode::drafter {

enum class Tensor : uint32_t {
  kEmbedding,          // [vocab, hidden] vocabulary-parallel: rank r holds rows of its vocabulary range
  kQkvA,               // [qkv_a, hidden] per layer, replicated
  kQB,                 // [heads · qk_head, q_lora] per layer, column-parallel (by head)
  kOProj,              // [hidden, heads · v_head] per layer, row-parallel
  kGateUp,             // [2 · intermediate, hidden] per layer: gate rows, then up rows; column-parallel
  kDown,               // [hidden, intermediate] per layer, row-parallel
  kContextProj,        // [hidden, context_in] column-parallel, gathered
  kLmHead,             // [vocab, hidden] vocabulary-parallel, gathered
  kInputNorm,          // [1, hidden] per layer (the norm before layer l; layer == layers: the final norm)
  kPostAttentionNorm,  // [1, hidden] per layer
  kQaNorm,             // [1, q_lora] per layer
  kKvNorm,             // [1, kv_lora] per layer
  kContextInput,       // [rows, context_in]: the step's synthetic context input (replicated)
  kTokens,             // the step's input tokens (row m: hash mod vocab)
};

struct WeightId {
  Tensor tensor = Tensor::kEmbedding;
  int layer = 0;
  // The hash's tensor key.
  uint32_t key() const { return static_cast<uint32_t>(tensor) * 256u + static_cast<uint32_t>(layer); }
  bool operator==(const WeightId&) const = default;
};

// Where a rank's [rows, cols] shard sits in the global [global_rows, global_cols]
// tensor: shard row j is global row (j / block_rows) · block_stride + row0 +
// j % block_rows (two blocks for gate_up: the rank's gate rows, then its up rows),
// shard column c is global column col0 + c.
struct ShardMap {
  int64_t rows = 0, cols = 0;
  int64_t global_rows = 0, global_cols = 0;
  int64_t row0 = 0, block_rows = 0, block_stride = 0, col0 = 0;
  int64_t global_row(int64_t j) const { return (j / block_rows) * block_stride + row0 + j % block_rows; }
};

// Element value: BF16(fma(scale, u, bias)), u = element_uniform(seed, key, global row, global col).
struct FillSpec {
  ShardMap map;
  uint64_t seed = 0;
  uint32_t key = 0;
  float scale = 1.0f;
  float bias = 0.0f;
};

// Rank `rank` of `tp`'s shard of a weight (not kContextInput / kTokens).
// Linear weights: scale sqrt(3 / K) (unit-variance outputs for unit inputs);
// the embedding: scale 1; norm weights: 1 + 0.1·u.
FillSpec weight_fill(const DrafterConfig& config, WeightId id, int tp, int rank);
// The first `rows` rows of the context input (scale 1, replicated on every rank).
FillSpec context_fill(const DrafterConfig& config, int64_t rows);

// The host copy of a fill (BF16 bits, [rows, cols] row-major).
std::vector<uint16_t> host_fill(const FillSpec& spec);

// The step's input tokens for rows 0 .. rows-1 (in [0, vocab)).
std::vector<int32_t> step_tokens(const DrafterConfig& config, int64_t rows);

// Every weight tensor of the drafter (for allocation and progress counts).
std::vector<WeightId> all_weights(const DrafterConfig& config);

}  // namespace tpdecode::drafter
