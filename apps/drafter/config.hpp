// The synthetic K3-DSpark-shaped drafter (docs/drafter.md): its shapes, and
// what each rank of a TP team holds of them.
#pragma once

#include <cstdint>
#include <string>

namespace tpdecode::drafter {

struct DrafterConfig {
  int64_t hidden = 7168;
  int layers = 5;
  int64_t q_lora = 1536;  // q_a rank
  int64_t kv_lora = 512;  // compressed kv latent
  int64_t rope = 64;      // rope part of each q head and the shared k_rope
  int64_t nope = 128;     // non-rope part of each q head
  int64_t v_head = 128;   // attention output per head
  int64_t heads = 96;
  int64_t intermediate = 18432;  // dense MLP
  int64_t vocab = 163840;
  int context_layers = 5;  // the context input is context_layers · hidden wide
  float eps = 1e-6f;
  uint64_t seed = 1;

  // The reference shapes (docs/drafter.md).
  static DrafterConfig reference();
  // Small enough for the CPU reference step in CI: hidden 512, 2 layers, 8 heads.
  static DrafterConfig reduced_cpu();
  // The reduced configuration of the GPU tests: hidden 4096 (a size ArNorm serves),
  // 2 layers, 16 heads, vocabulary 16384.
  static DrafterConfig reduced_gpu();

  int64_t qkv_a() const { return q_lora + kv_lora + rope; }  // fused_qkv_a outputs (2112)
  int64_t qk_head() const { return nope + rope; }            // q columns per head (192)
  int64_t context_in() const { return context_layers * hidden; }
  std::string describe() const;
};

// Per-rank widths at team size tp (column-parallel outputs, row-parallel inputs).
struct RankShapes {
  int tp = 1;
  int64_t heads = 0;         // heads / tp
  int64_t q = 0;             // heads/tp · qk_head: q_b outputs
  int64_t attn = 0;          // heads/tp · v_head: o_proj inputs
  int64_t intermediate = 0;  // intermediate / tp: down inputs
  int64_t gate_up = 0;       // 2 · intermediate / tp
  int64_t vocab = 0;         // vocab / tp: lm_head and embedding rows
  int64_t context = 0;       // hidden / tp: context projection outputs
};

// "" when `config` can be sharded over tp ranks, else why not (every split must be
// exact, and every per-rank width a multiple of 8: 16-byte rows).
std::string shard_refusal(const DrafterConfig& config, int tp);
// Throws InvalidArgument with shard_refusal's reason.
RankShapes rank_shapes(const DrafterConfig& config, int tp);

}  // namespace tpdecode::drafter
