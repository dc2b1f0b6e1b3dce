#include "trainer/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace trident {

float learning_rate_at(const TrainingConfig& t, int step) {
  if (step < t.warmup_steps) {
    return t.lr * static_cast<float>(step + 1) / static_cast<float>(t.warmup_steps);
  }
  if (t.lr_schedule == LrSchedule::kConstant) return t.lr;
  const int decay_steps = std::max(1, t.max_steps - t.warmup_steps);
  const double progress =
      std::clamp(static_cast<double>(step - t.warmup_steps) / decay_steps, 0.0, 1.0);
  double factor = 0.0;  // 1 at the start of decay, 0 at the end
  if (t.lr_schedule == LrSchedule::kCosine) {
    factor = 0.5 * (1.0 + std::cos(M_PI * progress));
  } else {
    factor = 1.0 - progress;
  }
  return static_cast<float>(t.min_lr + (t.lr - t.min_lr) * factor);
}

}  // namespace trident
