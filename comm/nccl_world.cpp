#include "comm/nccl_world.h"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "comm/nccl_plugin.h"
#include "kernels/cuda_plugin.h"

namespace trident {

namespace {

// The NCCL table of `library`, or why there is none.
Result<const TridentNcclPlugin*> nccl_table(const CudaPluginLibrary& library) {
  void* symbol = cuda_plugin_symbol(library, kNcclPluginEntry);
  if (symbol == nullptr) return Status::internal(library.path + " has no " + kNcclPluginEntry);
  const TridentNcclPlugin* table = reinterpret_cast<TridentNcclPluginEntry>(symbol)();
  TRIDENT_RETURN_IF_ERROR(
      check_plugin_table(library.path, kNcclPluginEntry, table, kNcclPluginAbiVersion));
  return table;
}

// The NCCL table of this process's plugin, loading the plugin if needed.
Result<const TridentNcclPlugin*> load_nccl_table() {
  const Result<CudaPluginLibrary>& plugin = cuda_plugin();
  if (!plugin.is_ok()) return plugin.status();
  return nccl_table(plugin.value());
}

// The NCCL table when the plugin is already loaded, else null. Never loads.
const TridentNcclPlugin* loaded_nccl_table() {
  const CudaPluginLibrary* library = loaded_cuda_plugin();
  if (library == nullptr) return nullptr;
  Result<const TridentNcclPlugin*> table = nccl_table(*library);
  return table.is_ok() ? table.value() : nullptr;
}

}  // namespace

bool build_has_nccl() { return load_nccl_table().is_ok(); }

Result<std::unique_ptr<Communicator>> make_nccl_world(std::unique_ptr<Communicator> host,
                                                      const NcclWorldConfig& config) {
  Result<const TridentNcclPlugin*> table = load_nccl_table();
  if (!table.is_ok()) {
    return Status::invalid_config(
        "runtime.device: cuda with NCCL groups needs the CUDA backend, which did not load: " +
        table.status().message());
  }
  return table.value()->make_world(std::move(host), config);
}

std::function<void(const HangReport&)> nccl_watchdog_handler() {
  // Decided when the hang is reported: the watchdog starts before the backend is chosen.
  return [](const HangReport& report) {
    if (const TridentNcclPlugin* table = loaded_nccl_table()) table->hang_handler()(report);
    const std::string line = report.message + "\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
    std::_Exit(kWatchdogExitCode);
  };
}

std::string loaded_nccl_version() {
  const TridentNcclPlugin* table = loaded_nccl_table();
  return table != nullptr ? table->version() : std::string();
}

}  // namespace trident
