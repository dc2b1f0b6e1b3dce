#include "parallel/param_store.h"

namespace trident {

ResidentParamStore::ResidentParamStore(const ParamLayout& layout, Ops& ops)
    : total_(layout.total_floats()),
      params_(ops, layout.total_floats() * sizeof(float)),
      grads_(ops, layout.total_floats() * sizeof(float)) {
  group_offset_.reserve(layout.groups.size());
  for (const ParamGroup& g : layout.groups) group_offset_.push_back(g.offset);
}

}  // namespace trident
