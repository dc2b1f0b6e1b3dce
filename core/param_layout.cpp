#include "core/param_layout.h"

#include <algorithm>
#include <cstring>

namespace trident {

size_t ParamLayout::total_floats() const {
  // The last group's end; max over groups so that empty groups of other pipeline stages
  // (offset 0, no floats) at the end of the table do not shrink it.
  size_t total = 0;
  for (const ParamGroup& g : groups) total = std::max(total, g.offset + g.num_floats);
  return total;
}

const ParamInfo* ParamLayout::find(std::string_view name) const {
  for (const ParamInfo& p : params) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

namespace {
// Calls f(local row i, global offset of that row's first local element, row length).
template <typename F>
void for_each_local_row(const ParamInfo& p, F&& f) {
  const int64_t rows = p.local_shape[0];
  const int64_t cols = p.local_shape.rank() == 2 ? p.local_shape[1] : 1;
  const int64_t global_cols = p.shape.rank() == 2 ? p.shape[1] : 1;
  const int64_t r0 = p.split_dim == 0 ? p.split_offset : 0;
  const int64_t c0 = p.split_dim == 1 ? p.split_offset : 0;
  for (int64_t i = 0; i < rows; ++i) f(i * cols, (r0 + i) * global_cols + c0, cols);
}
}  // namespace

std::vector<float> local_part(const ParamInfo& p, const float* global) {
  std::vector<float> out(static_cast<size_t>(p.numel()));
  for_each_local_row(p, [&](int64_t local, int64_t global_at, int64_t n) {
    std::memcpy(out.data() + local, global + global_at, static_cast<size_t>(n) * sizeof(float));
  });
  return out;
}

void place_local_part(const ParamInfo& p, const float* local, float* global) {
  for_each_local_row(p, [&](int64_t local_at, int64_t global_at, int64_t n) {
    std::memcpy(global + global_at, local + local_at, static_cast<size_t>(n) * sizeof(float));
  });
}

}  // namespace trident
