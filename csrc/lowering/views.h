// Views of a flat storage: reading a strided view of it as a value, and writing
// a value through such a view. Torch-free: a view is its sizes, strides and
// storage offset in elements (PyTorch's view model); the device layer passes a
// tensor's and gets back IR.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "ir/builder.h"

namespace torch_pjrt::lowering {

using ir::Builder;
using ir::DType;
using ir::Value;

struct ViewGeometry {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t offset = 0;  // the storage offset, in elements
};

// A view that is the leading corner of a reshaped window of its storage: a dense
// block, or a slice of one (split/narrow/chunk of a last dim, every other row ...).
// window_dims are the window's dims in decreasing-stride order; the view covers
// [0, corner) of them (plus size-1 and broadcast dims). Not `ok` for overlapping
// or interleaved strides.
struct StridedBox {
  bool ok = false;
  std::vector<int64_t> order;        // kept dims, by decreasing stride
  std::vector<int64_t> kept;         // kept dims, in original order
  std::vector<int64_t> window_dims;  // the window, reshaped
  std::vector<int64_t> corner;       // the view's extent in window_dims
  int64_t window = 1;                // elements of the window
  int64_t pad = 0;                   // zeros appended to the storage so that the window always fits
  bool dense() const { return window_dims == corner; }
};
StridedBox strided_box(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides);

// With a known offset (a captured graph), a non-dense window is a static slice of
// the storage seen as a grid [len / outer stride, window_dims[1:]...], with no
// padded copy of the storage. Empty when the view does not fit the grid.
struct GridWindow {
  std::vector<int64_t> grid, start, limit;
};
std::optional<GridWindow> grid_window(const StridedBox& box, int64_t len, int64_t offset, int64_t outer_stride);

// How a view's offset enters the program: `runtime_offset` makes the S64 value of
// the offset (a runtime parameter, so that views at different offsets share one
// program), called only when the offset is needed; `static_offsets` (a captured
// graph, specialized to its inputs' layout) allows static grid windows.
struct ViewOffsets {
  std::function<Value()> runtime_offset;
  bool static_offsets = false;
};

// offset + sum_d(i_d * stride_d), shaped [sizes..., 1] for gather/scatter.
Value element_offsets(Builder& b, const ViewGeometry& view, Value offset);
// The view's elements of `flat` (the storage, rank 1, in the view's dtype).
Value read_view(Builder& b, Value flat, const ViewGeometry& view, const ViewOffsets& offsets);
// `flat` with the view's elements replaced by `value` (shaped like the view, in flat's dtype).
Value write_view(Builder& b, Value flat, const ViewGeometry& view, Value value, const ViewOffsets& offsets);

}  // namespace torch_pjrt::lowering
