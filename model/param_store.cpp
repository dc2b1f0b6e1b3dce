#include "model/param_store.h"

#include <algorithm>

namespace trident {

size_t ParamLayout::total_floats() const {
  // The last group's end; max over groups so that empty groups of other pipeline stages
  // (offset 0, no floats) at the end of the table do not shrink it.
  size_t total = 0;
  for (const ParamGroup& g : groups) total = std::max(total, g.offset + g.num_floats);
  return total;
}

const ParamInfo* ParamLayout::find(const std::string& name) const {
  for (const ParamInfo& p : params) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

ResidentParamStore::ResidentParamStore(const ParamLayout& layout, Ops& ops)
    : total_(layout.total_floats()),
      params_(ops, layout.total_floats() * sizeof(float)),
      grads_(ops, layout.total_floats() * sizeof(float)) {
  group_offset_.reserve(layout.groups.size());
  for (const ParamGroup& g : layout.groups) group_offset_.push_back(g.offset);
}

}  // namespace trident
