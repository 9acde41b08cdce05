// Whether the memory of two views meets, for the checks that refuse an output over
// another operand (a kernel's threads read and write them in no common order).
#pragma once

#include <cstdint>

#include "core/check.hpp"
#include "tpdecode/tensor.hpp"

namespace tpdecode {

// The byte spans (first element to the end of the last row) of two non-null views
// overlap.
inline bool spans_overlap(const TensorView& a, const TensorView& b) {
  if (a.data == nullptr || b.data == nullptr || a.rows < 1 || b.rows < 1) return false;
  auto begin = [](const TensorView& t) { return reinterpret_cast<std::uintptr_t>(t.data); };
  auto end = [&](const TensorView& t) {
    return begin(t) + static_cast<std::uintptr_t>((t.rows - 1) * t.row_stride + t.cols) * t.element_size();
  };
  return begin(a) < end(b) && begin(b) < end(a);
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
  if (!spans_overlap(written, other) || (alias_ok && same_view(written, other))) return;
  check(false, "{}: {} ({}) overlaps {} ({}){}", op, written_name, written.describe(), other_name, other.describe(),
        alias_ok ? ": only the same view may be both" : "");
}

}  // namespace tpdecode
