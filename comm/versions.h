// The communication libraries of this process, for the start-up banner: "Open MPI v4.1.4,
// NCCL 2.28.9" (the versions loaded at run time; NCCL when the CUDA backend plugin,
// which holds comm/nccl/, is loaded: runtime.device cuda, or auto with the plugin there).
#pragma once

#include <string>

namespace trident {

std::string communication_libraries();

}  // namespace trident
