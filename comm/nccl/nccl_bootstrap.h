// NCCL bootstrap: how the ranks of a job agree on the NCCL world before any NCCL
// communicator exists (issue: the NCCL communicator). Built when the CUDA backend is
// (TRIDENT_HAVE_CUDA); no NCCL header is visible through this file.
//
// - share_nccl_unique_id: rank 0 of a host communicator (the MPI world) makes the id
//   (ncclGetUniqueId, 128 bytes; works without a GPU) and broadcasts it; a collective of
//   that communicator, so every rank ends with the same bytes.
// - rendezvous_nccl_unique_id: the same without MPI (e.g. srun without PMIx): rank 0
//   writes the id to a file in a directory every rank sees (written to a temporary name,
//   then renamed, so a reader never sees half an id); the other ranks poll for it until
//   `timeout`. The file is named by `job` (e.g. the Slurm job and step id), so runs sharing
//   the directory do not mix; a stale file of an earlier run with the same name is the
//   caller's to remove before rank 0 writes.
// - init_nccl_world: ncclCommInitRankConfig (blocking mode) on the current CUDA device.
//   Without a usable GPU it fails with NCCL's reason, never hangs: the error names the rank,
//   NCCL's error string and last-error text, and the launch environment
//   (comm/communicator.h launch_environment).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <string>

#include "comm/communicator.h"
#include "core/status.h"

namespace trident {

inline constexpr std::size_t kNcclUniqueIdBytes = 128;
using NcclUniqueId = std::array<std::byte, kNcclUniqueIdBytes>;

Result<NcclUniqueId> share_nccl_unique_id(Communicator& host);

Result<NcclUniqueId> rendezvous_nccl_unique_id(const std::string& dir, const std::string& job,
                                               int rank, std::chrono::milliseconds timeout);

// "NCCL 2.28.9" (ncclGetVersion of the library loaded at run time).
std::string nccl_version_string();

// Initialises, checks and destroys a world communicator of `nranks`: the bootstrap's
// end-to-end check (the NCCL Communicator builds on the same call). ok when NCCL could
// create the communicator.
Status init_nccl_world(const NcclUniqueId& id, int nranks, int rank);

}  // namespace trident
