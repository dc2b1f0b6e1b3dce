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
// From the first step, whatever the window holds: a non-finite loss or gradient norm
// fails (even with factor <= 0: such a state is never worth saving). And until the
// window has its min(window, 10) losses, the median is no reference yet, so an absolute
// bound stands in: a loss above kUniformMultiple (3) x ln(vocab_size), three times the
// loss of a uniform predictor, fails (lr 1000 gives ~1e7 at step 2; a fresh or
// fine-tuned model starts near or below ln(vocab_size)). vocab_size <= 1 leaves it out.
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
  LossSpikeGuard(double factor, int window, int vocab_size = 0);

  bool enabled() const { return factor_ > 0; }
  // The losses the window needs before the median is the reference: min(window, 10).
  size_t min_count() const { return min_count_; }
  // ok, or internal (exit 1): "loss 1.2e+17 at step 37 exceeds training.loss_spike_factor
  // 10 x the median 2.41 of the last 36 steps".
  // grad_norm is the step's global gradient norm (0 when not known).
  Status push(int step, double loss, double grad_norm = 0.0);
  // Oldest first.
  std::vector<double> recent_losses() const { return {window_.begin(), window_.end()}; }
  // Replaces the window with the newest `window` of `losses` (oldest first).
  void restore(const std::vector<double>& losses);
  // Empties the window: the next min(window, 10) steps have the absolute bound only.
  void reset() { window_.clear(); }

 private:
  double median() const;

  double factor_;
  size_t capacity_;
  size_t min_count_;
  double early_bound_;  // the absolute bound before the window is full enough; 0 = none
  std::deque<double> window_;
};

}  // namespace trident
