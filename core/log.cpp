#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "core/check.h"

namespace trident::log {

void init(int rank, int world_size, bool verbose) {
  set_process_identity({rank, world_size});
  auto logger = spdlog::stderr_color_mt("trident_rank" + std::to_string(rank));
  // Progress lines are for people: no timestamps on rank 0's info lines; keep the rank
  // on every line when more than one process writes to the same terminal.
  if (world_size > 1) {
    logger->set_pattern("[rank " + std::to_string(rank) + "] %^%l%$: %v");
  } else {
    logger->set_pattern("%^%l%$: %v");
  }
  if (verbose) {
    logger->set_level(spdlog::level::debug);
  } else {
    logger->set_level(rank == 0 ? spdlog::level::info : spdlog::level::warn);
  }
  spdlog::set_default_logger(logger);
}

}  // namespace trident::log
