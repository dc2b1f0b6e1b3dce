// Rank-aware logging on top of spdlog. Rank 0 logs at info; other ranks log warnings
// and errors only, so a 64-rank job prints one progress line per step, not 64.
// Messages carry "[rank N]" so a failure names where it happened.
#pragma once

#include <spdlog/spdlog.h>

namespace trident::log {

// Call once at start-up, after the rank is known (core/check.h's identity is set too).
void init(int rank, int world_size, bool verbose = false);

using spdlog::debug;
using spdlog::error;
using spdlog::info;
using spdlog::warn;

}  // namespace trident::log
