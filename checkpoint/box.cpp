#include "checkpoint/box.h"

#include <algorithm>
#include <cstring>

namespace trident {

int64_t volume(std::span<const int64_t> extent) {
  int64_t n = 1;
  for (int64_t e : extent) n *= e;
  return n;
}

std::string dims_to_string(std::span<const int64_t> dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

namespace {
std::string box_to_string(std::span<const int64_t> start, std::span<const int64_t> extent) {
  return "start " + dims_to_string(start) + " extent " + dims_to_string(extent);
}
}  // namespace

Status check_box_in_shape(const std::string& tensor, std::span<const int64_t> shape,
                          std::span<const int64_t> start, std::span<const int64_t> extent) {
  const std::string where = "tensor '" + tensor + "': box " + box_to_string(start, extent);
  if (start.size() != shape.size() || extent.size() != shape.size()) {
    return Status::invalid_input(where + " has a different rank than shape " +
                                 dims_to_string(shape));
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0 || start[d] < 0 || extent[d] < 0 || start[d] + extent[d] > shape[d]) {
      return Status::invalid_input(where + " leaves shape " + dims_to_string(shape));
    }
  }
  return Status::ok();
}

bool intersect_boxes(std::span<const int64_t> a_start, std::span<const int64_t> a_extent,
                     std::span<const int64_t> b_start, std::span<const int64_t> b_extent,
                     std::vector<int64_t>* start, std::vector<int64_t>* extent) {
  const size_t n = a_start.size();
  start->assign(n, 0);
  extent->assign(n, 0);
  for (size_t d = 0; d < n; ++d) {
    const int64_t lo = std::max(a_start[d], b_start[d]);
    const int64_t hi = std::min(a_start[d] + a_extent[d], b_start[d] + b_extent[d]);
    if (hi <= lo) return false;
    (*start)[d] = lo;
    (*extent)[d] = hi - lo;
  }
  return true;
}

void copy_region(const void* src_bytes, std::span<const int64_t> src_start,
                 std::span<const int64_t> src_extent, void* dst_bytes,
                 std::span<const int64_t> dst_start, std::span<const int64_t> dst_extent,
                 std::span<const int64_t> start, std::span<const int64_t> extent,
                 size_t element_bytes) {
  const char* src = static_cast<const char*>(src_bytes);
  char* dst = static_cast<char*>(dst_bytes);
  const int64_t width = static_cast<int64_t>(element_bytes);
  const size_t n = start.size();
  if (n == 0) {  // a scalar
    std::memcpy(dst, src, element_bytes);
    return;
  }
  if (volume(extent) == 0) return;
  // Row-major strides of both boxes.
  std::vector<int64_t> src_stride(n, 1), dst_stride(n, 1);
  for (size_t d = n - 1; d > 0; --d) {
    src_stride[d - 1] = src_stride[d] * src_extent[d];
    dst_stride[d - 1] = dst_stride[d] * dst_extent[d];
  }
  const size_t row_bytes = static_cast<size_t>(extent[n - 1]) * element_bytes;
  std::vector<int64_t> idx(n, 0);  // odometer over all dims but the last
  while (true) {
    int64_t s = 0, t = 0;
    for (size_t d = 0; d < n; ++d) {
      const int64_t g = start[d] + idx[d];
      s += (g - src_start[d]) * src_stride[d];
      t += (g - dst_start[d]) * dst_stride[d];
    }
    std::memcpy(dst + t * width, src + s * width, row_bytes);
    size_t d = n - 1;
    while (d > 0) {
      --d;
      if (++idx[d] < extent[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (n == 1) return;
  }
}

namespace {

bool contains(const BoxSpan& b, std::span<const int64_t> point) {
  for (size_t d = 0; d < point.size(); ++d) {
    if (point[d] < b.start[d] || point[d] >= b.start[d] + b.extent[d]) return false;
  }
  return true;
}

// Names one element no box covers, by coordinate compression: the boxes' edges cut
// each dimension into intervals, and a cell of that grid is covered wholly or not at
// all. Only called on the error path; gives up on huge grids.
std::string find_uncovered(std::span<const int64_t> shape, const std::vector<const BoxSpan*>& boxes) {
  const size_t n = shape.size();
  std::vector<std::vector<int64_t>> cuts(n);
  double cells = 1;
  for (size_t d = 0; d < n; ++d) {
    cuts[d] = {0, shape[d]};
    for (const BoxSpan* b : boxes) {
      cuts[d].push_back(b->start[d]);
      cuts[d].push_back(b->start[d] + b->extent[d]);
    }
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    cells *= static_cast<double>(cuts[d].size() - 1);
  }
  if (cells * static_cast<double>(boxes.size() + 1) > 1e8) return "";
  std::vector<size_t> idx(n, 0);
  std::vector<int64_t> point(n);
  while (true) {
    for (size_t d = 0; d < n; ++d) point[d] = cuts[d][idx[d]];
    bool covered = false;
    for (const BoxSpan* b : boxes) covered = covered || contains(*b, point);
    if (!covered) return dims_to_string(point);
    size_t d = n;
    while (d > 0) {
      --d;
      if (++idx[d] + 1 < cuts[d].size()) break;
      idx[d] = 0;
      if (d == 0) return "";
    }
    if (n == 0) return "";
  }
}

}  // namespace

Status check_exact_cover(const std::string& tensor, std::span<const int64_t> shape,
                         const std::vector<BoxSpan>& boxes) {
  std::vector<const BoxSpan*> live;
  int64_t covered = 0;
  for (const BoxSpan& b : boxes) {
    Status st = check_box_in_shape(tensor, shape, b.start, b.extent);
    if (!st.is_ok()) return st.with_context(b.label);
    const int64_t v = volume(b.extent);
    if (v == 0) continue;
    covered += v;
    live.push_back(&b);
  }
  // Overlaps: sweep along dimension 0 so only boxes whose dim-0 ranges meet are paired.
  const size_t n = shape.size();
  std::sort(live.begin(), live.end(), [n](const BoxSpan* a, const BoxSpan* b) {
    return n == 0 ? false : a->start[0] < b->start[0];
  });
  std::vector<int64_t> s, e;
  for (size_t i = 0; i < live.size(); ++i) {
    for (size_t j = i + 1; j < live.size(); ++j) {
      if (n > 0 && live[j]->start[0] >= live[i]->start[0] + live[i]->extent[0]) break;
      if (intersect_boxes(live[i]->start, live[i]->extent, live[j]->start, live[j]->extent, &s,
                          &e)) {
        return Status::corrupt("tensor '" + tensor + "': boxes in " + live[i]->label + " " +
                               box_to_string(live[i]->start, live[i]->extent) + " and " +
                               live[j]->label + " " +
                               box_to_string(live[j]->start, live[j]->extent) +
                               " overlap at element " + dims_to_string(s));
      }
    }
  }
  const int64_t total = volume(shape);
  if (covered != total) {
    const std::string where = find_uncovered(shape, live);
    return Status::corrupt("tensor '" + tensor + "' shape " + dims_to_string(shape) + ": " +
                           (where.empty() ? std::string("some element") : "element " + where) +
                           " is not covered by any box (boxes cover " + std::to_string(covered) +
                           " of " + std::to_string(total) + " elements)");
  }
  return Status::ok();
}

}  // namespace trident
