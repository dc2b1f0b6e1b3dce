// TRIDENT_MPI_CHECK: the always-on check for MPI calls inside comm/mpi/. MPI errors
// are not expected failures (the job cannot go on): abort with a message that names the
// call, the rank, the group, the collective, its label and MPI's own error string.
// Only files under comm/mpi/ may include this header (it brings in <mpi.h>).
#pragma once

// The C API only; Open MPI's deprecated C++ bindings add nothing and warn under -Wall.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <string>

#include "comm/communicator.h"

namespace trident {

// "MPI_ERR_TRUNCATE: message truncated" for an MPI error code.
std::string mpi_error_string(int code);

}  // namespace trident

// TRIDENT_MPI_CHECK(comm, MPI_Barrier(c), CollectiveKind::kBarrier, opts);
#define TRIDENT_MPI_CHECK(comm, call, kind, opts)                                                \
  do {                                                                                           \
    const int trident_mpi_rc_ = (call);                                                          \
    if (trident_mpi_rc_ != MPI_SUCCESS)                                                          \
      (comm).fail(#call, (kind), (opts), ::trident::mpi_error_string(trident_mpi_rc_), __FILE__, \
                  __LINE__);                                                                     \
  } while (0)
