// The NCCL half of the CUDA backend plugin's entry points (kernels/cuda_plugin.h has the
// plugin, its loader and the rules both halves follow): libtrident_cuda.so's
// trident_nccl_plugin_v1 returns this table; comm/nccl_world.cpp and comm/versions.cpp
// are its only users.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/nccl_world.h"
#include "comm/watchdog.h"
#include "core/status.h"

namespace trident {

// The version of TridentNcclPlugin's layout; bump it when a field changes.
inline constexpr int kNcclPluginAbiVersion = 1;
inline constexpr const char* kNcclPluginEntry = "trident_nccl_plugin_v1";

// The table trident_nccl_plugin_v1 returns (comm/nccl/plugin_entry.cpp).
struct TridentNcclPlugin {
  int abi_version;              // kNcclPluginAbiVersion of the plugin's build
  const char* interface_stamp;  // the same stamp as the plugin's TridentCudaPlugin
  // make_nccl_world_communicator (comm/nccl/nccl_communicator.h) with `config`.
  Result<std::unique_ptr<Communicator>> (*make_world)(std::unique_ptr<Communicator> host,
                                                      const NcclWorldConfig& config);
  // nccl_hang_handler (comm/nccl/nccl_abort.h): abort every NCCL communicator, exit 1.
  std::function<void(const HangReport&)> (*hang_handler)();
  // "NCCL 2.28.9" (ncclGetVersion of the library loaded).
  std::string (*version)();
};

using TridentNcclPluginEntry = const TridentNcclPlugin* (*)();

}  // namespace trident

// Defined by the plugin only; found with dlsym (kNcclPluginEntry).
extern "C" const trident::TridentNcclPlugin* trident_nccl_plugin_v1();
