#include "parallel/expert_parallel.h"

#include <string>

#include "core/check.h"

namespace trident {

ParamLayout layout_subset(const ParamLayout& layout, int begin, int end) {
  TRIDENT_CHECK_MSG(0 <= begin && begin <= end && end <= static_cast<int>(layout.groups.size()),
                    "layout_subset [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") of " + std::to_string(layout.groups.size()) + " groups");
  ParamLayout out;
  out.params = layout.params;
  out.groups.resize(static_cast<size_t>(end));
  size_t cursor = 0;
  for (int g = 0; g < end; ++g) {
    ParamGroup& to = out.groups[static_cast<size_t>(g)];
    to.id = g;
    to.offset = cursor;
    if (g < begin) continue;  // emptied
    const ParamGroup& from = layout.groups[static_cast<size_t>(g)];
    to.num_floats = from.num_floats;
    to.params = from.params;
    for (int p : from.params) {
      ParamInfo& info = out.params[static_cast<size_t>(p)];
      info.offset = info.offset - from.offset + cursor;  // 16-aligned: both group starts are
    }
    cursor += from.num_floats;
  }
  return out;
}

SplitParamStore::SplitParamStore(ParamStore& low, ParamStore& high, int first_split)
    : low_(low), high_(high), first_split_(first_split) {
  TRIDENT_CHECK_MSG(low.compute_dtype() == high.compute_dtype(),
                    "SplitParamStore: the two stores' compute dtypes differ");
}

}  // namespace trident
