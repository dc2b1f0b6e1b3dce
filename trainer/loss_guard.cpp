#include "trainer/loss_guard.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace trident {

namespace {
constexpr size_t kMinSteps = 10;
// A spike must also exceed the median by this much (nats): a run that has driven its
// loss near 0 on easy data sees 3x-25x noise (0.02 -> 0.5) that is no divergence.
constexpr double kMinExcess = 1.0;
// Before the window is full enough, a loss above this many times ln(vocab_size) (the
// loss of a uniform predictor) is divergence.
constexpr double kUniformMultiple = 3.0;

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", v);
  return buf;
}
}  // namespace

LossSpikeGuard::LossSpikeGuard(double factor, int window, int vocab_size)
    : factor_(factor),
      capacity_(static_cast<size_t>(std::max(1, window))),
      min_count_(std::min(capacity_, kMinSteps)),
      early_bound_(vocab_size > 1 ? kUniformMultiple * std::log(static_cast<double>(vocab_size))
                                  : 0.0) {}

double LossSpikeGuard::median() const {
  std::vector<double> v(window_.begin(), window_.end());
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + mid);
  return 0.5 * (lower + upper);
}

Status LossSpikeGuard::push(int step, double loss, double grad_norm) {
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    return Status::internal("loss " + number(loss) + " (gradient norm " + number(grad_norm) +
                            ") at step " + std::to_string(step) + " is not finite");
  }
  if (enabled() && window_.size() < min_count_ && early_bound_ > 0 && loss > early_bound_) {
    return Status::internal("loss " + number(loss) + " at step " + std::to_string(step) +
                            " exceeds " + number(kUniformMultiple) +
                            " x ln(model.vocab_size) = " + number(early_bound_) +
                            ", the bound while the guard has fewer than " +
                            std::to_string(min_count_) + " steps in its window");
  }
  if (enabled() && window_.size() >= min_count_) {
    const double m = median();
    if (loss > factor_ * m && loss > m + kMinExcess) {
      return Status::internal("loss " + number(loss) + " at step " + std::to_string(step) +
                              " exceeds training.loss_spike_factor " + number(factor_) +
                              " x the median " + number(m) + " of the last " +
                              std::to_string(window_.size()) + " steps");
    }
  }
  window_.push_back(loss);
  while (window_.size() > capacity_) window_.pop_front();
  return Status::ok();
}

void LossSpikeGuard::restore(const std::vector<double>& losses) {
  const size_t n = std::min(losses.size(), capacity_);
  window_.assign(losses.end() - static_cast<std::ptrdiff_t>(n), losses.end());
}

}  // namespace trident
