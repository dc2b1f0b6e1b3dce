// The CUDA backend as a plugin. libtrident_cuda.so holds kernels/cuda/ and comm/nccl/ (every
// line that calls CUDA, cuBLASLt, cuDNN or NCCL); `trident` links none of those libraries
// and loads the plugin with dlopen when runtime.device is cuda or auto, so the same binary
// starts on a CPU cluster or a login node that has no CUDA library.
//
// - Where: $TRIDENT_CUDA_PLUGIN when set (a path to the library), else libtrident_cuda.so
//   beside the running executable (the directory of /proc/self/exe).
// - Symbols: the plugin holds the CUDA backend only. What it uses from core/, kernels/ and
//   comm/ (Status, CHECK, logging, the process identity, Ops, Communicator) it takes from
//   the executable that loads it, which exports those libraries whole (CMake:
//   trident_plugin_host), so there is one copy of each: one logger, one rank identity.
//   The plugin's own CUDA libraries are found by the usual search (LD_LIBRARY_PATH, its
//   RUNPATH, ld.so.cache).
// - Entry points: extern "C" functions returning a table of functions.
//   trident_cuda_plugin_v1 (TridentCudaPlugin, below: devices and Ops) and
//   trident_nccl_plugin_v1 (comm/nccl_plugin.h: the NCCL world, its hang handler, the
//   version). Each table starts with its ABI version and the interface stamp: a hash of the
//   core/, kernels/ and comm/ headers and the compiler that the build computes
//   (trident_plugin_stamp.h). Both sides must agree on both, since the tables pass C++
//   objects (Result, unique_ptr<Ops>, std::function): a plugin built from other headers
//   is refused, naming both stamps, instead of crashing on a changed vtable.
// - Loading happens at most once per process (thread-safe); the outcome, success or the
//   error, is kept; the library is never unloaded.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "kernels/ops.h"

namespace trident {

// The version of TridentCudaPlugin's layout; bump it when a field changes.
inline constexpr int kCudaPluginAbiVersion = 1;
inline constexpr const char* kCudaPluginEntry = "trident_cuda_plugin_v1";
inline constexpr const char* kCudaPluginFileName = "libtrident_cuda.so";
inline constexpr const char* kCudaPluginEnv = "TRIDENT_CUDA_PLUGIN";

// The table trident_cuda_plugin_v1 returns (kernels/cuda/plugin_entry.cpp).
struct TridentCudaPlugin {
  int abi_version;              // kCudaPluginAbiVersion of the plugin's build
  const char* interface_stamp;  // TRIDENT_PLUGIN_INTERFACE of the plugin's build
  // The visible CUDA devices (>= 1), or an error "cudaGetDeviceCount: <CUDA's reason>"
  // (no driver, no device).
  Result<int> (*device_count)();
  // The CUDA Ops on this process's device: the launcher's local rank (kernels/backend.h)
  // modulo `device_count`. Errors: invalid_config naming the environment variable or
  // runtime.device and the reason.
  Result<std::unique_ptr<Ops>> (*make_ops)(int device_count);
};

}  // namespace trident

// Defined by the plugin only; the loader finds it with dlsym (kCudaPluginEntry).
extern "C" const trident::TridentCudaPlugin* trident_cuda_plugin_v1();

namespace trident {

using TridentCudaPluginEntry = const TridentCudaPlugin* (*)();

// The interface stamp this executable was built with (both sides compare it).
const char* cuda_plugin_interface_stamp();

// Where this process looks for the plugin: $TRIDENT_CUDA_PLUGIN, else libtrident_cuda.so
// in the executable's directory.
std::string cuda_plugin_path();

// The checks every table of the plugin passes before it is used (both tables start with
// abi_version and interface_stamp): the entry returned one, its ABI version is
// `expected_abi`, its stamp is this executable's. Errors (internal) name `path`: "<path>:
// <entry> returned no table", "<path> has plugin ABI 2, this trident expects 1", "<path>
// was built from other Trident headers (interface <a>, this trident <b>): rebuild both".
Status check_plugin_table_header(const std::string& path, int abi_version, int expected_abi,
                                 const char* interface_stamp);
template <class Table>
Status check_plugin_table(const std::string& path, const char* entry, const Table* table,
                          int expected_abi) {
  if (table == nullptr) return Status::internal(path + ": " + entry + " returned no table");
  return check_plugin_table_header(path, table->abi_version, expected_abi,
                                   table->interface_stamp);
}

// A loaded plugin: the dlopen handle, where it came from, and its kernels table.
struct CudaPluginLibrary {
  void* handle = nullptr;
  std::string path;
  const TridentCudaPlugin* table = nullptr;
};

// dlopen(path, RTLD_NOW | RTLD_LOCAL), then the entry point and the two checks. Errors
// (internal) say what failed and name `path`: "cannot load <path>: <dlerror>" (a missing
// file, a missing CUDA library, an unresolved symbol), "<path> has no <entry>
// (<dlerror>)", "<path> has plugin ABI 2, this trident expects 1", "<path> was built from
// other Trident headers (interface <a>, this trident <b>): rebuild both". The handle of a
// refused library is closed. Not cached (the tests call it with fakes).
Result<CudaPluginLibrary> open_cuda_plugin(const std::string& path);

// This process's plugin: open_cuda_plugin(cuda_plugin_path()) on the first call; the same
// outcome after.
const Result<CudaPluginLibrary>& cuda_plugin();

// The plugin when an earlier cuda_plugin() call loaded it, else null. Never loads.
const CudaPluginLibrary* loaded_cuda_plugin();

// Whether the plugin file exists where cuda_plugin_path() points (a build without nvcc has
// none; runtime.device=auto then says nothing about it).
bool cuda_plugin_file_exists();

// Another extern "C" entry point of `library` (dlsym), or null.
void* cuda_plugin_symbol(const CudaPluginLibrary& library, const char* name);

}  // namespace trident
