// The NCCL world for layers above comm/ (comm/nccl/ is private to comm/): whether this
// process has NCCL, the world factory, and the watchdog's NCCL abort handler. No NCCL or
// CUDA header here. NCCL lives in the CUDA backend plugin (kernels/cuda_plugin.h, its NCCL
// table in comm/nccl_plugin.h); without it (a build without nvcc, a machine without the
// CUDA libraries) the factory fails naming why.
//
// Selecting NCCL (what the trainer does when its Ops have a device stream, i.e.
// runtime.device resolves to cuda, and the world has more than one rank; a world of one
// gets no NCCL: its groups are SelfCommunicators copying through Ops::copy, and groups of
// one inside an NCCL world are SelfCommunicators too, comm/nccl/nccl_communicator.h):
//   world = make_world_communicator(argc, argv);                  // MPI, host space
//   Watchdog watchdog({.on_hang = nccl_watchdog_handler()});     // aborts NCCL, exit 1
//   nccl = make_nccl_world(world->split(0, rank, "world", kHost),  // a host duplicate
//                          {.compute_stream = ops.native_stream()}).value();
//   groups = make_process_groups(*nccl, layout);                 // dp/tp/pp/embedding: NCCL
// (trainer/trainer.cpp, Trainer::init; compiled, not yet run on a GPU.)
// The world stays host space (flags, losses, agreement go over MPI); its device splits
// are NCCL groups with host twins (comm/nccl/nccl_communicator.h has the contract).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/watchdog.h"
#include "core/status.h"

namespace trident {

// True when the CUDA backend plugin, which holds comm/nccl/, loads (it loads it).
bool build_has_nccl();

struct NcclWorldConfig {
  int device = -1;                 // cudaSetDevice first; -1 = the current device
  void* compute_stream = nullptr;  // the CUDA Ops' cudaStream_t; null = host-synchronous calls
  bool synchronous = false;        // wait for every device call (debugging)
  std::chrono::milliseconds init_timeout{std::chrono::minutes(5)};
};

// The NCCL world over `host` (see above). Errors: no CUDA backend plugin (invalid_config,
// naming runtime.device and why it did not load), no usable device on some rank, NCCL
// failing to initialise (internal; message names the rank). Collective over `host`.
Result<std::unique_ptr<Communicator>> make_nccl_world(std::unique_ptr<Communicator> host,
                                                      const NcclWorldConfig& config = {});

// WatchdogOptions::on_hang that aborts every NCCL communicator (bounded, 2 s) and exits
// 1 after the watchdog's line when the plugin is loaded at the time of the hang; without
// it, the watchdog's default (line, exit 1).
std::function<void(const HangReport&)> nccl_watchdog_handler();

// "NCCL 2.28.9" when the plugin is loaded (ncclGetVersion of the library it loaded), else
// "". Never loads the plugin.
std::string loaded_nccl_version();

}  // namespace trident
