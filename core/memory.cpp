#include "core/memory.h"

#include <string>

#include "core/check.h"

namespace trident {

const char* mem_space_name(MemSpace space) {
  return space == MemSpace::kHost ? "host" : "device";
}

void DevPtr::dtype_mismatch(DType wanted) const {
  check_failed("dtype() == wanted",
               std::string("device pointer of dtype ") + dtype_name(dtype_) + " used as " +
                   dtype_name(wanted),
               __FILE__, __LINE__);
}

}  // namespace trident
