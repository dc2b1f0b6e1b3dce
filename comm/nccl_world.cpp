#include "comm/nccl_world.h"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>

#if TRIDENT_HAVE_NCCL
#include "comm/nccl/nccl_abort.h"
#include "comm/nccl/nccl_communicator.h"
#endif

namespace trident {

bool build_has_nccl() { return TRIDENT_HAVE_NCCL != 0; }

Result<std::unique_ptr<Communicator>> make_nccl_world(std::unique_ptr<Communicator> host,
                                                      const NcclWorldConfig& config) {
#if TRIDENT_HAVE_NCCL
  NcclWorldOptions options;
  options.device = config.device;
  options.compute_stream = config.compute_stream;
  options.synchronous = config.synchronous;
  options.init_timeout = config.init_timeout;
  return make_nccl_world_communicator(std::move(host), options);
#else
  (void)host;
  (void)config;
  return Status::invalid_config(
      "runtime.device: cuda with more than one rank needs NCCL, and this build has none "
      "(built without nvcc; see docs/README.md)");
#endif
}

std::function<void(const HangReport&)> nccl_watchdog_handler() {
#if TRIDENT_HAVE_NCCL
  return nccl_hang_handler();
#else
  return [](const HangReport& report) {
    const std::string line = report.message + "\n";
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
    std::_Exit(kWatchdogExitCode);
  };
#endif
}

}  // namespace trident
