#include "comm/versions.h"

#include "comm/mpi/mpi_communicator.h"
#if TRIDENT_HAVE_NCCL
#include "comm/nccl/nccl_bootstrap.h"
#endif

namespace trident {

std::string communication_libraries() {
  std::string text = mpi_library_version();
#if TRIDENT_HAVE_NCCL
  text += ", " + nccl_version_string();
#endif
  return text;
}

}  // namespace trident
