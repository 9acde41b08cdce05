// Whether the memory of two views meets, for the checks that refuse an output over
// another operand (a kernel's threads read and write them in no common order).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "core/check.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode {

// `rows` rows of `width` bytes, `stride` bytes apart, from byte address `begin`.
struct ByteRows {
  int64_t begin = 0;
  int64_t rows = 0;
  int64_t width = 0;
  int64_t stride = 0;
};

// Whether two sets of rows share a byte (none where either has no row). Exact for
// one row stride (e.g. column windows of one buffer: disjoint windows do not
// overlap); for different strides, whether their spans (first byte to the end of
// the last row) overlap.
inline bool rows_overlap(const ByteRows& a, const ByteRows& b) {
  if (a.rows < 1 || b.rows < 1) return false;
  const bool spans = a.begin < b.begin + (b.rows - 1) * b.stride + b.width &&
                     b.begin < a.begin + (a.rows - 1) * a.stride + a.width;
  const int64_t stride = a.stride;
  if (!spans || stride != b.stride || a.width > stride || b.width > stride) return spans;
  // Row r of a and row r - k of b meet where b's start lies within (k S - b.width,
  // k S + a.width) of a's, for some k in (-b.rows, a.rows): only k next to d / S can.
  const int64_t d = b.begin - a.begin;
  const int64_t near = d >= 0 ? d / stride : -((-d + stride - 1) / stride);  // floor(d / S)
  for (int64_t k = near - 1; k <= near + 1; ++k)
    if (k > -b.rows && k < a.rows && k * stride - b.width < d && d < k * stride + a.width) return true;
  return false;
}

// Two non-null views share a byte (rows_overlap).
inline bool views_overlap(const TensorView& a, const TensorView& b) {
  if (a.data == nullptr || b.data == nullptr) return false;
  auto bytes = [](const TensorView& v) {
    const auto size = static_cast<int64_t>(v.element_size());
    return ByteRows{static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(v.data)), v.rows, v.cols * size,
                    v.row_stride * size};
  };
  return rows_overlap(bytes(a), bytes(b));
}

// The same elements: address, dtype, shape and stride.
inline bool same_view(const TensorView& a, const TensorView& b) {
  return a.data == b.data && a.dtype == b.dtype && a.rows == b.rows && a.cols == b.cols &&
         a.row_stride == b.row_stride;
}

// InvalidArgument where `written` overlaps `other`, unless they are the same view
// and `alias_ok` (an in-place form the call documents).
inline void check_apart(const char* op, const TensorView& written, const char* written_name, const TensorView& other,
                        const char* other_name, bool alias_ok = false) {
  if (!views_overlap(written, other) || (alias_ok && same_view(written, other))) return;
  check(false, "{}: {} ({}) overlaps {} ({}){}", op, written_name, written.describe(), other_name, other.describe(),
        alias_ok ? ": only the same view may be both" : "");
}

// An operand of a call, for check_writes_apart. A written one may name the read
// operand it may be the same view as (`may_be`: an in-place form the call documents).
struct Operand {
  const TensorView* view;
  const char* name;
  const TensorView* may_be = nullptr;
};

// Every written operand apart from every read one (but the same view as its
// `may_be`) and from every other written one; null views take no memory.
inline void check_writes_apart(const char* op, std::initializer_list<Operand> writes,
                               std::initializer_list<Operand> reads) {
  for (auto w = writes.begin(); w != writes.end(); ++w) {
    for (const Operand& r : reads) check_apart(op, *w->view, w->name, *r.view, r.name, r.view == w->may_be);
    for (auto later = w + 1; later != writes.end(); ++later)
      check_apart(op, *w->view, w->name, *later->view, later->name);
  }
}

}  // namespace tpdecode
