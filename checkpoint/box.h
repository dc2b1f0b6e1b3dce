// Boxes: rectangular N-D regions of a global row-major tensor, the unit in which
// checkpoints are saved and read (docs/CHECKPOINTS.md "Layout on disk"). A box is (start, extent)
// with one entry per dimension; a 0-D tensor has one box with empty start and extent.
// Every FSDP/TP/PP shard of a tensor is a box, which is what makes checkpoints
// reshardable: a reader intersects the boxes it needs with the boxes on disk.
//
// Pure geometry: no I/O, no threads, no state. Expected failures (boxes that leave
// their tensor, gaps, overlaps) are Status values whose message names the tensor, the
// boxes involved (by `label`, typically the file holding them) and an element.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/memory.h"
#include "core/status.h"
#include "core/tensor.h"

namespace trident {

// A box's elements: where they live and what they are. Host memory is a typed pointer
// (the pointer's type is the dtype); device memory is a DevPtr (which carries its
// dtype), which host code never dereferences: the writer downloads it through Ops. The
// constructors are implicit so that a box names its data as {..., ptr}.
class BoxData {
 public:
  BoxData() = default;
  BoxData(const float* host) : BoxData(host, DType::kF32) {}    // NOLINT(implicit)
  BoxData(const bf16_t* host) : BoxData(host, DType::kBF16) {}  // NOLINT(implicit)
  BoxData(const int32_t* host) : BoxData(host, DType::kI32) {}  // NOLINT(implicit)
  BoxData(DevPtr device)                                        // NOLINT(implicit)
      : space_(MemSpace::kDevice), dtype_(device.dtype()), device_(device) {}

  MemSpace space() const { return space_; }
  DType dtype() const { return dtype_; }
  bool is_null() const { return space_ == MemSpace::kHost ? host_ == nullptr : device_.is_null(); }
  const void* host() const { return host_; }  // space() == kHost
  DevPtr device() const { return device_; }   // space() == kDevice

 private:
  BoxData(const void* host, DType dtype) : dtype_(dtype), host_(host) {}

  MemSpace space_ = MemSpace::kHost;
  DType dtype_ = DType::kF32;
  const void* host_ = nullptr;
  DevPtr device_;
};

// What a rank hands to CheckpointWriter::save: one box of one global tensor of dtype
// f32, bf16 or i32. `data` holds volume(extent) elements, row-major over `extent`, and
// must stay valid only for the duration of save() (it is copied, or downloaded, there).
struct BoxRef {
  std::string tensor;                  // global name, e.g. "param/layers.0.attn.q.weight"
  std::vector<int64_t> global_shape;   // the whole tensor's shape
  std::vector<int64_t> start;          // first element of the box, per dimension
  std::vector<int64_t> extent;         // size of the box, per dimension
  BoxData data;                        // (extent...) row-major
};

// A box without data, with a label for messages ("rank_1.bin").
struct BoxSpan {
  std::vector<int64_t> start;
  std::vector<int64_t> extent;
  std::string label;
};

// Product of the dimensions (1 for a 0-D shape). Assumes non-negative entries.
int64_t volume(std::span<const int64_t> extent);

// "[2, 3]".
std::string dims_to_string(std::span<const int64_t> dims);

// Ok when start/extent have shape's rank, extents are >= 0 and the box lies inside the
// tensor. Message: "tensor 'w': box start [..] extent [..] leaves shape [..]".
Status check_box_in_shape(const std::string& tensor, std::span<const int64_t> shape,
                          std::span<const int64_t> start, std::span<const int64_t> extent);

// The intersection of boxes a and b (same rank). Returns false when it is empty.
bool intersect_boxes(std::span<const int64_t> a_start, std::span<const int64_t> a_extent,
                     std::span<const int64_t> b_start, std::span<const int64_t> b_extent,
                     std::vector<int64_t>* start, std::vector<int64_t>* extent);

// Copies the region (start, extent) — in global coordinates, inside both boxes — from
// src, laid out row-major over box (src_start, src_extent), into dst, laid out over
// (dst_start, dst_extent); elements are `element_bytes` wide. Host memory only. The
// innermost dimension is copied with memcpy.
void copy_region(const void* src, std::span<const int64_t> src_start,
                 std::span<const int64_t> src_extent, void* dst,
                 std::span<const int64_t> dst_start, std::span<const int64_t> dst_extent,
                 std::span<const int64_t> start, std::span<const int64_t> extent,
                 size_t element_bytes);

// Ok when the boxes tile `shape` exactly: each lies inside it, no two overlap, and
// together they cover every element. Empty boxes are allowed and ignored. Errors:
//   "tensor 'w': boxes in rank_0.bin start [0, 0] extent [2, 4] and rank_1.bin start
//    [1, 0] extent [2, 4] overlap at element [1, 0]"
//   "tensor 'w': element [3, 2] is not covered by any box (boxes cover 20 of 24 elements)"
Status check_exact_cover(const std::string& tensor, std::span<const int64_t> shape,
                         const std::vector<BoxSpan>& boxes);

}  // namespace trident
