#include "trainer/loss_guard.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace trident {

namespace {
constexpr size_t kMinSteps = 10;
// A spike must also exceed the median by this much (nats): a run that has driven its
// loss near 0 on easy data sees 3x-25x noise (0.02 -> 0.5) that is no divergence.
constexpr double kMinExcess = 1.0;

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", v);
  return buf;
}
}  // namespace

LossSpikeGuard::LossSpikeGuard(double factor, int window)
    : factor_(factor),
      capacity_(static_cast<size_t>(std::max(1, window))),
      min_count_(std::min(capacity_, kMinSteps)) {}

double LossSpikeGuard::median() const {
  std::vector<double> v(window_.begin(), window_.end());
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + mid);
  return 0.5 * (lower + upper);
}

Status LossSpikeGuard::push(int step, double loss) {
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
