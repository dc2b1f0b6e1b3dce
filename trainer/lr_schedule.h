// Learning-rate schedules: linear warmup from lr/warmup to lr over warmup_steps, then
// constant, cosine decay to min_lr, or linear decay to min_lr at max_steps.
// Steps are 0-based: step 0 is the first optimizer step.
#pragma once

#include "config/config.h"

namespace trident {

float learning_rate_at(const TrainingConfig& training, int step);

}  // namespace trident
