#include "program/program_plan.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "core/tensor_overlap.hpp"

namespace tpdecode::program {

std::vector<int64_t> check_buffers(const std::vector<OpBuffers>& ops) {
  // Exact for one row stride: ops may write disjoint column windows of one buffer.
  auto overlap = [](const Matrix& a, const Matrix& b) {
    auto bytes = [](const Matrix& m) {
      return ByteRows{static_cast<int64_t>(m.data), m.rows, m.cols * 2, m.row_stride * 2};
    };
    return rows_overlap(bytes(a), bytes(b));
  };
  auto same = [](const Matrix& a, const Matrix& b) {
    return a.data == b.data && a.rows == b.rows && a.cols == b.cols && a.row_stride == b.row_stride;
  };
  struct Written {
    std::size_t op;
    const Matrix* m;
  };
  std::vector<Written> outs;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (!ops[i].folded) outs.push_back({i, &ops[i].out});
    if (ops[i].residual_out.data != 0) outs.push_back({i, &ops[i].residual_out});
  }
  // A residual stream in place: a norm's residual_out that is the residual_out of a
  // norm its residual chain (residual_after, each link in place) reaches.
  auto in_place = [&](const Written& earlier, const Written& later) {
    if (later.m != &ops[later.op].residual_out || earlier.m != &ops[earlier.op].residual_out ||
        !same(*earlier.m, *later.m))
      return false;
    std::size_t j = later.op;
    while (j != earlier.op && ops[j].residual_after >= 0 &&
           same(ops[j].residual_out, ops[static_cast<std::size_t>(ops[j].residual_after)].residual_out))
      j = static_cast<std::size_t>(ops[j].residual_after);
    return j == earlier.op;
  };
  for (std::size_t a = 0; a < outs.size(); ++a)
    for (std::size_t b = a + 1; b < outs.size(); ++b)
      check(!overlap(*outs[a].m, *outs[b].m) || in_place(outs[a], outs[b]),
            "gemm program: the outs of ops {} and {} overlap", outs[a].op, outs[b].op);
  // A residual_out w that continues op i's input residual in place: op i's own, or
  // that of a norm whose residual chain (residual_after) reaches op i.
  auto writes_in_place = [&](const Written& w, std::size_t i) {
    std::size_t j = w.op;
    if (w.m != &ops[j].residual_out || !same(*w.m, ops[i].residual)) return false;
    while (j != i && ops[j].residual_after >= 0 &&
           same(ops[j].residual_out, ops[static_cast<std::size_t>(ops[j].residual_after)].residual_out))
      j = static_cast<std::size_t>(ops[j].residual_after);
    return j == i;
  };
  std::vector<int64_t> window(ops.size(), 0);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const OpBuffers& op = ops[i];
    for (const Written& w : outs) {
      if (op.after < 0) check(!overlap(*w.m, op.x), "gemm program: op {} writes op {}'s input x", w.op, i);
      if (op.residual.data != 0 && !writes_in_place(w, i))
        check(!overlap(*w.m, op.residual), "gemm program: op {} writes op {}'s input residual", w.op, i);
    }
    if (op.after < 0) continue;
    check(static_cast<std::size_t>(op.after) < i, "gemm program: op {} reads op {} (an earlier op or -1)", i,
          op.after);
    const Matrix& from = ops[static_cast<std::size_t>(op.after)].out;
    const auto bytes = static_cast<int64_t>(op.x.data) - static_cast<int64_t>(from.data);
    const int64_t column = bytes / 2;
    check(bytes >= 0 && bytes % 16 == 0 && column + op.x.cols <= from.cols && op.x.rows == from.rows &&
              (op.x.rows == 1 || op.x.row_stride == from.row_stride),
          "gemm program: op {}'s x is not a window of op {}'s out (the same rows and row stride, its columns "
          "from a multiple of 8 inside it)",
          i, op.after);
    window[i] = column;
  }
  return window;
}

MailboxLayout mailbox_layout(const std::vector<OpShape>& ops, const std::vector<int>& after, int m, int ctas) {
  MailboxLayout l;
  l.offset.assign(ops.size(), -1);
  l.stride.assign(ops.size(), 0);
  l.stats.assign(ops.size(), -1);
  l.stats_stride = (ctas + 3) / 4 * 4;
  for (std::size_t o = 0; o < ops.size(); ++o) {
    const int64_t stride = ops[o].norm ? (ops[o].folded ? 0 : l.stats_stride)
                                       : (ops[o].row_stats ? row_stats_stride(ops[o].n) : 0);
    if (stride == 0) continue;
    l.stats[o] = l.epoch_elements;
    l.epoch_elements += 2 * m * stride;
  }
  for (int a : after)
    if (a >= 0 && l.offset[static_cast<std::size_t>(a)] < 0) {
      const auto o = static_cast<std::size_t>(a);
      l.stride[o] = (ops[o].n + 7) / 8 * 8;
      l.offset[o] = l.epoch_elements;
      l.epoch_elements += m * l.stride[o];
    }
  return l;
}

int64_t steps_of(const OpShape& op, int depth) {
  const int64_t chunks = op.k / 64;
  return (chunks + depth - 1) / depth;
}

Plan plan_program(const std::vector<OpShape>& ops, int ctas, int m, int depth) {
  check(ctas > 0 && m > 0 && depth > 0, "gemm program: {} CTAs, {} rows, depth {}", ctas, m, depth);
  Plan plan;
  // Per CTA, its units in op order (then concatenated).
  std::vector<std::vector<Unit>> per_cta(static_cast<std::size_t>(ctas));
  for (std::size_t o = 0; o < ops.size(); ++o) {
    const OpShape& op = ops[o];
    if (op.norm && op.folded) {  // counted by nobody, read through its producer
      plan.blocks.push_back(0);
      continue;
    }
    if (op.norm) {
      check(op.n == op.k && op.k > 0 && op.k % 8 == 0, "gemm program: norm op {} of {} columns (a multiple of 8)", o,
            op.k);
      const int64_t share = (op.k / 8 + ctas - 1) / ctas;
      // Unavailable: a limit of the program's CTAs (their registers), not a bad op.
      check<Unavailable>(m * share <= kNormMaxItems,
                         "gemm program: norm op {} of {} columns at {} rows on {} CTAs: {} pieces of 16 bytes per CTA, "
                         "above the {} served",
                         o, op.k, m, ctas, m * share, kNormMaxItems);
      plan.blocks.push_back(ctas);
      continue;
    }
    check(op.n > 0 && op.k > 0 && op.k % 64 == 0, "gemm program: op {} is [{}, {}] (K must be a multiple of 64)", o,
          op.n, op.k);
    const int64_t blocks = (op.n + kBlockRows - 1) / kBlockRows;
    const int64_t steps = steps_of(op, depth);
    const int64_t work = blocks * steps;  // block-major: index b * steps + s
    check(blocks < (int64_t{1} << 30) && steps < (int64_t{1} << 30), "gemm program: op {} is too large", o);
    plan.blocks.push_back(static_cast<int32_t>(blocks));
    // Block b's shares, in K order: CTA c takes work [work * c / ctas, work * (c + 1) / ctas).
    std::vector<std::vector<std::pair<int, Unit>>> by_block(static_cast<std::size_t>(blocks));
    for (int c = 0; c < ctas; ++c) {
      const int64_t begin = work * c / ctas, end = work * (c + 1) / ctas;
      for (int64_t at = begin; at < end;) {
        const int64_t b = at / steps;
        const int64_t stop = std::min(end, (b + 1) * steps);
        Unit u;
        u.op = static_cast<int32_t>(o);
        u.block = static_cast<int32_t>(b);
        u.step_begin = static_cast<int32_t>(at - b * steps);
        u.step_end = static_cast<int32_t>(stop - b * steps);
        by_block[static_cast<std::size_t>(b)].push_back({c, u});
        at = stop;
      }
    }
    for (auto& shares : by_block) {
      const int parts = static_cast<int>(shares.size());
      plan.max_parts = std::max(plan.max_parts, parts);
      for (int p = 0; p < parts; ++p) {
        Unit& u = shares[static_cast<std::size_t>(p)].second;
        u.part = p;
        u.parts = parts;
        u.scratch = parts > 1 ? plan.scratch_floats : 0;
        per_cta[static_cast<std::size_t>(shares[static_cast<std::size_t>(p)].first)].push_back(u);
      }
      if (parts > 1) plan.scratch_floats += static_cast<int64_t>(parts) * m * kBlockRows;
    }
  }
  // A CTA's units of one op were appended block by block, so already in op order.
  plan.cta_begin.push_back(0);
  for (const std::vector<Unit>& units : per_cta) {
    plan.units.insert(plan.units.end(), units.begin(), units.end());
    plan.cta_begin.push_back(static_cast<int32_t>(plan.units.size()));
  }
  return plan;
}

}  // namespace tpdecode::program
