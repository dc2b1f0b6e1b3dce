// The communication libraries of this build, for the start-up banner: "Open MPI v4.1.4,
// NCCL 2.28.9" (the versions loaded at run time; NCCL only in a build with the CUDA
// backend, TRIDENT_HAVE_CUDA, which builds comm/nccl/).
#pragma once

#include <string>

namespace trident {

std::string communication_libraries();

}  // namespace trident
