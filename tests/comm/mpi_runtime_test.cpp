// The MPI runtime Trident initializes itself (comm/mpi/mpi_communicator.cpp MpiRuntime):
// Open MPI is told to yield in its progress loop (mpi_yield_when_idle), unless the
// environment already says otherwise. Each test initializes MPI once, as a singleton (no
// mpirun), in its own process (ctest runs every test apart); the value checked is the one
// Open MPI itself reports through the MPI tool interface after the initialization.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "comm/mpi/mpi_communicator.h"

namespace trident::test {
namespace {

// Open MPI's control variable `name` (an int or a bool) as an int, or -1 where this MPI
// has none.
int control_variable(const char* name) {
  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return -1;
  int count = 0, value = -1;
  MPI_T_cvar_get_num(&count);
  for (int i = 0; i < count && value < 0; ++i) {
    char var[256], desc[1024];
    int var_len = sizeof(var), desc_len = sizeof(desc), verbosity = 0, bind = 0, scope = 0;
    MPI_Datatype type;
    MPI_T_enum enumtype;
    if (MPI_T_cvar_get_info(i, var, &var_len, &verbosity, &type, &enumtype, desc, &desc_len,
                            &bind, &scope) != MPI_SUCCESS ||
        std::strcmp(var, name) != 0 || (type != MPI_INT && type != MPI_C_BOOL)) {
      continue;
    }
    MPI_T_cvar_handle handle;
    int elements = 0;
    if (MPI_T_cvar_handle_alloc(i, nullptr, &handle, &elements) != MPI_SUCCESS) continue;
    if (elements == 1) {
      // Open MPI 4.1 types its boolean variables MPI_C_BOOL: one byte.
      alignas(8) unsigned char bytes[8] = {};
      if (MPI_T_cvar_read(handle, bytes) == MPI_SUCCESS) {
        int as_int = 0;
        std::memcpy(&as_int, bytes, sizeof(as_int));
        value = type == MPI_INT ? as_int : (bytes[0] != 0 ? 1 : 0);
      }
    }
    MPI_T_cvar_handle_free(&handle);
  }
  MPI_T_finalize();
  return value;
}

TEST(MpiRuntime, TellsOpenMpiToYieldUnlessTheEnvironmentSaysOtherwise) {
  // What the environment asked for before Trident started MPI (ctest may run this entry
  // with OMPI_MCA_mpi_yield_when_idle=0: then 0 must survive).
  const char* preset = std::getenv("OMPI_MCA_mpi_yield_when_idle");
  const int expected = preset ? std::atoi(preset) : 1;
  int argc = 0;
  char** argv = nullptr;
  std::unique_ptr<Communicator> world = make_mpi_world_communicator(&argc, &argv);
  ASSERT_EQ(world->size(), 1);
  const int value = control_variable("mpi_yield_when_idle");
  if (value < 0) GTEST_SKIP() << "this MPI has no control variable mpi_yield_when_idle (not Open MPI)";
  EXPECT_EQ(value, expected) << "OMPI_MCA_mpi_yield_when_idle was "
                             << (preset ? std::string("'") + preset + "'" : std::string("unset"))
                             << " before MPI_Init";
}

}  // namespace
}  // namespace trident::test
