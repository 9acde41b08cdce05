#include "drafter/weights.hpp"

#include <cmath>

#include "core/bf16.hpp"
#include "drafter/weight_hash.hpp"
#include "tpdecode/error.hpp"

namespace tpdecode::drafter {

namespace {

// One block of contiguous global rows [row0, row0 + rows) and all columns.
ShardMap rows_block(int64_t global_rows, int64_t global_cols, int64_t row0, int64_t rows) {
  return {rows, global_cols, global_rows, global_cols, row0, rows, 0, 0};
}

ShardMap replicated(int64_t rows, int64_t cols) { return rows_block(rows, cols, 0, rows); }

// Column-parallel: rank r holds rows [r·N/tp, (r+1)·N/tp).
ShardMap column_parallel(int64_t n, int64_t k, int tp, int rank) { return rows_block(n, k, rank * (n / tp), n / tp); }

// Row-parallel: rank r holds columns [r·K/tp, (r+1)·K/tp) of every row.
ShardMap row_parallel(int64_t n, int64_t k, int tp, int rank) {
  return {n, k / tp, n, k, 0, n, 0, rank * (k / tp)};
}

FillSpec linear(const DrafterConfig& c, WeightId id, const ShardMap& map) {
  return {map, c.seed, id.key(), std::sqrt(3.0f / static_cast<float>(map.global_cols)), 0.0f};
}

FillSpec norm(const DrafterConfig& c, WeightId id, int64_t width) {
  return {replicated(1, width), c.seed, id.key(), 0.1f, 1.0f};
}

}  // namespace

FillSpec weight_fill(const DrafterConfig& c, WeightId id, int tp, int rank) {
  const RankShapes s = rank_shapes(c, tp);
  require(rank >= 0 && rank < tp, "drafter weight_fill: rank out of range");
  switch (id.tensor) {
    case Tensor::kEmbedding:
      return {column_parallel(c.vocab, c.hidden, tp, rank), c.seed, id.key(), 1.0f, 0.0f};
    case Tensor::kQkvA: return linear(c, id, replicated(c.qkv_a(), c.hidden));
    case Tensor::kQB: return linear(c, id, column_parallel(c.heads * c.qk_head(), c.q_lora, tp, rank));
    case Tensor::kOProj: return linear(c, id, row_parallel(c.hidden, c.heads * c.v_head, tp, rank));
    case Tensor::kGateUp: {
      // Why two blocks: SiLU(gate)·up pairs column j of the gate with column j of the
      // up projection, so a rank must hold both halves of its intermediate range.
      ShardMap m{s.gate_up, c.hidden, 2 * c.intermediate, c.hidden, rank * s.intermediate, s.intermediate,
                 c.intermediate, 0};
      return linear(c, id, m);
    }
    case Tensor::kDown: return linear(c, id, row_parallel(c.hidden, c.intermediate, tp, rank));
    case Tensor::kContextProj: return linear(c, id, column_parallel(c.hidden, c.context_in(), tp, rank));
    case Tensor::kLmHead: return linear(c, id, column_parallel(c.vocab, c.hidden, tp, rank));
    case Tensor::kInputNorm:
    case Tensor::kPostAttentionNorm: return norm(c, id, c.hidden);
    case Tensor::kQaNorm: return norm(c, id, c.q_lora);
    case Tensor::kKvNorm: return norm(c, id, c.kv_lora);
    case Tensor::kContextInput:
    case Tensor::kTokens: break;
  }
  throw InvalidArgument("drafter weight_fill: not a weight");
}

FillSpec context_fill(const DrafterConfig& c, int64_t rows) {
  return {replicated(rows, c.context_in()), c.seed, WeightId{Tensor::kContextInput, 0}.key(), 1.0f, 0.0f};
}

std::vector<uint16_t> host_fill(const FillSpec& f) {
  std::vector<uint16_t> out(static_cast<std::size_t>(f.map.rows * f.map.cols));
  for (int64_t j = 0; j < f.map.rows; ++j) {
    const auto row = static_cast<uint64_t>(f.map.global_row(j));
    for (int64_t c = 0; c < f.map.cols; ++c) {
      const float u = element_uniform(f.seed, f.key, row, static_cast<uint64_t>(f.map.col0 + c));
      out[static_cast<std::size_t>(j * f.map.cols + c)] = bf16::from_float(std::fma(f.scale, u, f.bias));
    }
  }
  return out;
}

std::vector<int32_t> step_tokens(const DrafterConfig& c, int64_t rows) {
  std::vector<int32_t> t(static_cast<std::size_t>(rows));
  const uint32_t key = WeightId{Tensor::kTokens, 0}.key();
  for (int64_t m = 0; m < rows; ++m)
    t[static_cast<std::size_t>(m)] =
        static_cast<int32_t>(element_hash(c.seed, key, static_cast<uint64_t>(m), 0) % static_cast<uint64_t>(c.vocab));
  return t;
}

std::vector<WeightId> all_weights(const DrafterConfig& c) {
  std::vector<WeightId> w{{Tensor::kEmbedding, 0}, {Tensor::kContextProj, 0}, {Tensor::kLmHead, 0}};
  for (int l = 0; l < c.layers; ++l)
    for (Tensor t : {Tensor::kQkvA, Tensor::kQB, Tensor::kOProj, Tensor::kGateUp, Tensor::kDown, Tensor::kInputNorm,
                     Tensor::kPostAttentionNorm, Tensor::kQaNorm, Tensor::kKvNorm})
      w.push_back({t, l});
  w.push_back({Tensor::kInputNorm, c.layers});  // the final norm
  return w;
}

}  // namespace tpdecode::drafter
