// Which split blocks of a GEMM program's plan end late twice: blocks of which two or
// more parts are their CTAs' last units of the op. Those parts all finish when the op
// does, so the block's completion waits one L2 round trip for the others' partials
// (the finisher's polls) after the last MMA; a part that is its CTA's first unit was
// written long before. With fewer blocks than CTAs some blocks end late twice
// whatever the order of a CTA's units (each CTA has one last unit); in this plan,
// each block that holds a CTA wholly. The counts per op of the drafter chain's
// shapes at each TP, for the plan's 64-row blocks and, as a what-if, 32- and 16-row
// blocks (the same plan over n * 64 / rows rows). CPU only, from the repository's
// root:
//   g++ -std=c++20 -O2 -Isrc -Iinclude -DFMT_HEADER_ONLY=1 scripts/plan_late_parts.cpp
//       src/program/program_plan.cpp -o /tmp/plan_late_parts && /tmp/plan_late_parts
// docs/performance.md ("Chains") has what it printed.
#include <cstdio>
#include <map>
#include <vector>

#include "program/program_plan.hpp"

using tpdecode::program::OpShape;
using tpdecode::program::Plan;

namespace {

struct Count {
  int blocks = 0;
  int split = 0;
  int late_twice = 0;
};

// The plan at 8 rows, with kernel_shape's 4 chunks a K step (its depth up to 8 tokens).
Count count(int64_t n, int64_t k, int ctas) {
  const Plan plan = tpdecode::program::plan_program({OpShape{n, k}}, ctas, 8, 4);
  std::map<int, int> late_parts;  // block -> its parts that are their CTA's last unit
  std::map<int, int> parts;
  for (int c = 0; c < ctas; ++c)
    for (int i = plan.cta_begin[c]; i < plan.cta_begin[c + 1]; ++i) {
      const int block = plan.units[i].block;
      ++parts[block];
      if (i + 1 == plan.cta_begin[c + 1]) ++late_parts[block];
    }
  Count r;
  for (const auto& [block, p] : parts) {
    ++r.blocks;
    r.split += p > 1;
    r.late_twice += p > 1 && late_parts[block] >= 2;
  }
  return r;
}

}  // namespace

int main() {
  constexpr int kCtas = 132;  // an H100's or H200's SMs
  for (int tp : {8, 4, 1}) {
    // The drafter layer's per-rank GEMMs (tools/gemm_shapes.cpp's tp sets).
    const int64_t shapes[5][2] = {
        {2112, 7168}, {18432 / tp, 1536}, {7168, 12288 / tp}, {36864 / tp, 7168}, {7168, 18432 / tp}};
    std::printf("TP %d, %d CTAs: op n x k: blocks / split / ending late twice, at 64-, 32-, 16-row blocks\n", tp,
                kCtas);
    for (const auto& s : shapes) {
      std::printf("  %5lld x %5lld:", static_cast<long long>(s[0]), static_cast<long long>(s[1]));
      for (int rows : {64, 32, 16}) {
        const Count c = count(s[0] * 64 / rows, s[1], kCtas);
        std::printf("  %4d / %4d / %3d", c.blocks, c.split, c.late_twice);
      }
      std::printf("\n");
    }
  }
}
