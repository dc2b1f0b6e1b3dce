// parallel.dp: auto — the data-parallel degree a launch takes from its world size
// (docs/CONFIG.md "parallel"): a run continued on fewer nodes keeps tp, pp and cp and
// the global batch, and gets dp = world size / (cp * tp * pp), more micro-batches per rank.
#pragma once

#include "config/config.h"
#include "core/status.h"

namespace trident {

// The value parallel.dp holds while it is auto (load_config and parse_config keep it;
// validate_config skips the checks that need dp). A written 0 is refused.
inline constexpr int kDpAuto = 0;

// parallel.dp: auto becomes world_size / (cp * tp * pp), and the config is validated again
// with it (e.g. training.global_batch_size against the new dp). A config with a fixed dp
// is left as it is (the trainer checks it against the world). invalid_config when the
// world size is not a multiple of cp * tp * pp or the resolved config is invalid.
Status resolve_auto_dp(Config* config, int world_size);

}  // namespace trident
