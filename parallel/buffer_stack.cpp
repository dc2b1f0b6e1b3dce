#include "parallel/buffer_stack.h"

#include <utility>

#include "core/check.h"

namespace trident {

BufferStack::BufferStack(Ops& ops, size_t capacity_bytes, std::string name)
    : ops_(&ops), name_(std::move(name)) {
  if (capacity_bytes > 0) buffer_ = DeviceBuffer(ops, capacity_bytes);
}

DevPtr BufferStack::push(size_t bytes, bool zeroed, const std::string& what) {
  TRIDENT_CHECK_MSG(used_ + bytes <= capacity(),
                    name_ + ": " + what + " needs " + std::to_string(bytes) + " bytes on top of " +
                        std::to_string(used_) + " held (" + std::to_string(entries_.size()) +
                        " buffers), past the " + std::to_string(capacity()) +
                        " planned at construction");
  const DevPtr slice = buffer_.get().byte_offset(used_);
  entries_.push_back({used_, bytes, what});
  used_ += bytes;
  if (zeroed && bytes > 0) ops_->zero(slice, bytes);
  return slice;
}

void BufferStack::pop(DevPtr slice) {
  TRIDENT_CHECK_MSG(!entries_.empty(), name_ + ": a buffer given back, none held");
  const Entry& top = entries_.back();
  if (slice.raw() != buffer_.get().byte_offset(top.offset).raw()) {
    std::string given = "a buffer it does not hold";
    for (const Entry& e : entries_) {
      if (slice.raw() == buffer_.get().byte_offset(e.offset).raw()) given = e.what;
    }
    TRIDENT_CHECK_MSG(false, name_ + ": " + given + " released before " + top.what +
                                 ", which was acquired after it (acquisitions must nest: "
                                 "release in the reverse order)");
  }
  used_ = top.offset;
  entries_.pop_back();
}

}  // namespace trident
