#include "tpdecode/draft_logits.hpp"

#include <cmath>

#include "core/check.hpp"
#include "core/tensor_overlap.hpp"
#include "gemm/logits_epilogue_launch.hpp"

namespace tpdecode {

void draft_logits(DecodeGemm& head, const TensorView& hidden, const TensorView& shard, const LogitsGather& gather,
                  const TensorView& gathered, const LogitsEpilogue& epilogue, const TensorView& out,
                  cudaStream_t stream) {
  const int64_t m = hidden.rows;
  check(gathered.data != nullptr && gathered.dtype == DType::kBF16 && gathered.rows == m,
        "draft_logits: gathered must be bf16 with {} rows ({})", m, gathered.describe());
  check(gathered.row_stride >= gathered.cols, "draft_logits: gathered row stride below its columns");
  check(gathered.cols % head.n() == 0, "draft_logits: gathered has {} columns, not a multiple of the shard's {}",
        gathered.cols, head.n());
  check(gather || (gathered.data == shard.data && gathered.cols == shard.cols &&
                   gathered.row_stride == shard.row_stride),
        "draft_logits: without a gather, `gathered` must be the shard itself (TP 1)");
  check(epilogue.vocab >= 1 && epilogue.vocab <= gathered.cols, "draft_logits: vocab {} outside 1..{}", epilogue.vocab,
        gathered.cols);
  check(std::isfinite(epilogue.soft_cap) && epilogue.soft_cap >= 0.0f, "draft_logits: soft cap {} (finite, >= 0)",
        epilogue.soft_cap);
  check(std::isfinite(epilogue.scale), "draft_logits: scale {} (finite)", epilogue.scale);
  check(m <= kLogitsMaxRows, "draft_logits: {} rows, at most {} (the epilogue's grid)", m, kLogitsMaxRows);
  // Why: the epilogue writes single elements, so out's rows need no 16-byte alignment.
  check(out.data != nullptr && out.dtype == DType::kBF16 && out.cols == epilogue.vocab && out.row_stride >= out.cols &&
            reinterpret_cast<std::uintptr_t>(out.data) % 2 == 0,
        "draft_logits: out must be bf16 [{}, {}] ({})", m, epilogue.vocab, out.describe());
  check(out.rows == m, "draft_logits: out has {} rows, hidden has {}", out.rows, m);
  // Why: the epilogue's threads read gathered and write out in no common order.
  check_writes_apart("draft_logits", {{&out, "out"}}, {{&gathered, "gathered"}, {&shard, "shard"}, {&hidden, "hidden"}});
  check_writes_apart("draft_logits", {{&gathered, "gathered"}}, {{&hidden, "hidden"}});

  head.run(hidden, shard, stream);
  if (gather) gather(shard, gathered, stream);
  LogitsEpilogueParams p{};
  p.in = gathered.data;
  p.out = out.data;
  p.rows = m;
  p.vocab = epilogue.vocab;
  p.in_stride = gathered.row_stride;
  p.out_stride = out.row_stride;
  p.soft_cap = epilogue.soft_cap;
  p.scale = epilogue.scale;
  launch_logits_epilogue(p, stream);
}

}  // namespace tpdecode
