// LossSpikeGuard: stops a run whose loss jumps far above its recent level — a diverged
// but finite state (loss 1e17) that would otherwise be checkpointed and, through
// retention, rotate the healthy checkpoints out (docs/CONFIG.md, training.loss_spike_*).
//
// push(step, loss) compares the loss of each optimizer step with the median of the last
// `window` accepted losses. Once at least min(window, 10) are in the window, a loss that
// exceeds factor x median, and the median by more than 1, fails and is not added;
// otherwise it joins the window, which keeps the newest `window`. The median, not the
// mean, so that one noisy step does not move the reference; the excess of 1 (the loss is
// a cross-entropy in nats) so that near-zero losses on easy data, whose noise is many
// times the median, never fire. factor <= 0 turns the check off (the window is still
// kept, so a resumed run can turn it on).
//
// The window is part of the trainer state of a checkpoint (recent_losses()/restore()),
// so a resumed run has its reference from its first step. Not thread-safe.
#pragma once

#include <deque>
#include <vector>

#include "core/status.h"

namespace trident {

class LossSpikeGuard {
 public:
  LossSpikeGuard(double factor, int window);

  bool enabled() const { return factor_ > 0; }
  // ok, or internal (exit 1): "loss 1.2e+17 at step 37 exceeds training.loss_spike_factor
  // 10 x the median 2.41 of the last 36 steps".
  Status push(int step, double loss);
  // Oldest first.
  std::vector<double> recent_losses() const { return {window_.begin(), window_.end()}; }
  // Replaces the window with the newest `window` of `losses` (oldest first).
  void restore(const std::vector<double>& losses);

 private:
  double median() const;

  double factor_;
  size_t capacity_;
  size_t min_count_;
  std::deque<double> window_;
};

}  // namespace trident
