#include "lowering/views.h"

#include <algorithm>

namespace torch_pjrt::lowering {

namespace {
int64_t position(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) - v.begin(); }
}  // namespace

StridedBox strided_box(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  StridedBox box;
  for (int64_t d = 0; d < static_cast<int64_t>(sizes.size()); ++d) {
    if (sizes[d] != 1 && strides[d] != 0) box.kept.push_back(d);
  }
  box.order = box.kept;
  std::stable_sort(box.order.begin(), box.order.end(), [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  size_t k = box.order.size();
  if (k == 0) {
    box.ok = true;
    return box;
  }
  for (size_t j = 0; j + 1 < k; ++j) {
    int64_t outer = strides[box.order[j]], inner = strides[box.order[j + 1]];
    if (outer % inner != 0 || outer < sizes[box.order[j + 1]] * inner) return box;  // overlapping or interleaved
  }
  box.window_dims.push_back(sizes[box.order[0]]);
  box.corner.push_back(sizes[box.order[0]]);
  for (size_t j = 0; j + 1 < k; ++j) {
    box.window_dims.push_back(strides[box.order[j]] / strides[box.order[j + 1]]);
    box.corner.push_back(sizes[box.order[j + 1]]);
  }
  int64_t innermost = strides[box.order[k - 1]];
  if (innermost != 1) {
    box.window_dims.push_back(innermost);
    box.corner.push_back(1);
  }
  box.window = sizes[box.order[0]] * strides[box.order[0]];
  // The window may run past the storage's end (the last row's gap): offset +
  // window <= offset + last element + outermost stride <= storage + that stride.
  box.pad = box.dense() ? 0 : strides[box.order[0]];
  box.ok = true;
  return box;
}

std::optional<GridWindow> grid_window(const StridedBox& box, int64_t len, int64_t offset, int64_t outer_stride) {
  if (box.window_dims.empty() || outer_stride <= 0 || len % outer_stride != 0) return std::nullopt;
  GridWindow w;
  w.grid = box.window_dims;
  w.grid[0] = len / outer_stride;
  w.start.assign(w.grid.size(), 0);
  int64_t rest = offset;
  for (size_t i = w.grid.size(); i-- > 1;) {
    w.start[i] = rest % w.grid[i];
    rest /= w.grid[i];
  }
  w.start[0] = rest;
  for (size_t i = 0; i < w.grid.size(); ++i) {
    w.limit.push_back(w.start[i] + box.corner[i]);
    if (w.limit[i] > w.grid[i]) return std::nullopt;
  }
  return w;
}

Value element_offsets(Builder& b, const ViewGeometry& view, Value offset) {
  std::vector<int64_t> sizes = view.sizes;
  Value idx = b.broadcast_to(offset, sizes);
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1 || view.strides[d] == 0) continue;
    Value term = b.binary("multiply", b.iota(DType::S64, sizes, static_cast<int64_t>(d)),
                          b.constant_int(DType::S64, view.strides[d], sizes));
    idx = b.binary("add", idx, term);
  }
  sizes.push_back(1);
  return b.reshape(idx, sizes);
}

Value read_view(Builder& b, Value flat, const ViewGeometry& view, const ViewOffsets& offsets) {
  const DType T = b.dtype(flat);
  const std::vector<int64_t>& sizes = view.sizes;
  const int64_t len = b.dims(flat)[0], offset = view.offset;
  StridedBox box = strided_box(view.sizes, view.strides);
  std::optional<GridWindow> grid;
  if (box.ok && offsets.static_offsets && !box.dense()) grid = grid_window(box, len, offset, view.strides[box.order[0]]);
  if (!box.ok) {
    // General strided view: gather the elements at its offsets.
    return b.gather(flat, element_offsets(b, view, offsets.runtime_offset()), {}, {0}, {0},
                    static_cast<int64_t>(sizes.size()), {1}, sizes);
  }
  Value block = flat;
  if (grid) {
    block = b.slice(b.reshape(flat, grid->grid), grid->start, grid->limit, std::vector<int64_t>(grid->grid.size(), 1));
  } else if (!(offset == 0 && box.window == len)) {
    if (box.pad > 0) flat = b.pad(flat, b.constant(T, 0), {0}, {box.pad}, {0});
    block = b.dynamic_slice(flat, {offsets.runtime_offset()}, {box.window});
  }
  std::vector<int64_t> sorted_sizes, perm;
  for (int64_t d : box.order) sorted_sizes.push_back(sizes[d]);
  if (!box.dense() && !grid) {
    block = b.reshape(block, box.window_dims);
    block = b.slice(block, std::vector<int64_t>(box.corner.size(), 0), box.corner, std::vector<int64_t>(box.corner.size(), 1));
  }
  block = b.reshape(block, sorted_sizes);
  for (int64_t d : box.kept) perm.push_back(position(box.order, d));
  block = b.transpose(block, perm);
  return b.broadcast_in_dim(block, sizes, box.kept);
}

Value write_view(Builder& b, Value flat, const ViewGeometry& view, Value value, const ViewOffsets& offsets) {
  const DType T = b.dtype(flat);
  const std::vector<int64_t>& sizes = view.sizes;
  const int64_t len = b.dims(flat)[0], offset = view.offset;
  StridedBox box = strided_box(view.sizes, view.strides);
  if (!box.ok) {
    std::vector<int64_t> inserted{0};
    return b.scatter(flat, element_offsets(b, view, offsets.runtime_offset()), value, {}, inserted, inserted,
                     static_cast<int64_t>(sizes.size()), "");
  }
  // Drop broadcast (stride 0) and size-1 dims, then undo the permutation.
  std::vector<int64_t> start(sizes.size(), 0), limit = sizes, step(sizes.size(), 1);
  for (size_t d = 0; d < sizes.size(); ++d)
    if (view.strides[d] == 0) limit[d] = std::min<int64_t>(1, sizes[d]);
  Value u = b.slice(value, start, limit, step);
  std::vector<int64_t> kept_sizes, perm;
  for (int64_t d : box.kept) kept_sizes.push_back(sizes[d]);
  u = b.reshape(u, kept_sizes);
  for (int64_t d : box.order) perm.push_back(position(box.kept, d));
  u = b.transpose(u, perm);
  if (box.dense()) return b.dynamic_update_slice(flat, b.reshape(u, {box.window}), {offsets.runtime_offset()});
  if (offsets.static_offsets) {
    if (auto grid = grid_window(box, len, offset, view.strides[box.order[0]])) {
      std::vector<Value> at;
      for (int64_t i : grid->start) at.push_back(b.constant_int(DType::S64, i));
      Value g = b.dynamic_update_slice(b.reshape(flat, grid->grid), b.reshape(u, box.corner), at);
      return b.reshape(g, {len});
    }
  }
  // Read the window around the view, write the corner, put the window back.
  Value padded = b.pad(flat, b.constant(T, 0), {0}, {box.pad}, {0});
  Value at = offsets.runtime_offset();
  Value win = b.reshape(b.dynamic_slice(padded, {at}, {box.window}), box.window_dims);
  std::vector<Value> zeros(box.window_dims.size(), b.constant_int(DType::S64, 0));
  win = b.dynamic_update_slice(win, b.reshape(u, box.corner), zeros);
  padded = b.dynamic_update_slice(padded, b.reshape(win, {box.window}), {at});
  return b.slice_dim(padded, 0, 0, len);
}

}  // namespace torch_pjrt::lowering
