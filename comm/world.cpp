// make_world_communicator (comm/communicator.h): picks the MPI backend or a
// SelfCommunicator, so that the interface file (comm/communicator.cpp) includes no backend.
#include <memory>

#include "comm/communicator.h"
#include "comm/mpi/mpi_communicator.h"
#include "core/check.h"

namespace trident {

std::unique_ptr<Communicator> make_world_communicator(int* argc, char*** argv) {
  std::unique_ptr<Communicator> world;
  if (detect_launcher().empty()) {
    world = std::make_unique<SelfCommunicator>("world");
  } else {
    world = make_mpi_world_communicator(argc, argv);
  }
  set_process_identity({world->rank(), world->size()});
  return world;
}

}  // namespace trident
