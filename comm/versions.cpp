#include "comm/versions.h"

#include "comm/mpi/mpi_communicator.h"
#include "comm/nccl_world.h"

namespace trident {

std::string communication_libraries() {
  std::string text = mpi_library_version();
  const std::string nccl = loaded_nccl_version();
  if (!nccl.empty()) text += ", " + nccl;
  return text;
}

}  // namespace trident
