#include "parallel/param_store.h"

#include <string>

#include "core/check.h"

namespace trident {

void check_compute_dtype(DType compute) {
  TRIDENT_CHECK_MSG(compute == DType::kF32 || compute == DType::kBF16,
                    std::string("parameter compute dtype must be f32 or bf16, got ") +
                        dtype_name(compute));
}

ResidentParamStore::ResidentParamStore(const ParamLayout& layout, Ops& ops, DType compute)
    : total_(layout.total_floats()),
      compute_((check_compute_dtype(compute), compute)),
      params_(ops, layout.total_floats() * dtype_size(compute)),
      grads_(ops, layout.total_floats() * sizeof(float)) {
  group_offset_.reserve(layout.groups.size());
  for (const ParamGroup& g : layout.groups) group_offset_.push_back(g.offset);
}

}  // namespace trident
