#include "trainer/straggler.h"

#include <algorithm>
#include <limits>
#include <fmt/format.h>

#include "core/check.h"

namespace trident {

namespace {

// The median rank's value: the lower middle one, floor((n - 1) / 2) in ascending order, so
// that it is one rank's own figure and, of two ranks, the faster one (the mean of the two
// middle values would put a straggler of two ranks at most 2x its own mean).
double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>((v.size() - 1) / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

double ratio_to(double value, double median) { return median > 0 ? value / median : 1.0; }

}  // namespace

SlowestRank slowest_rank(std::span<const double> busy_ms) {
  SlowestRank s;
  if (busy_ms.empty()) return s;
  const auto it = std::max_element(busy_ms.begin(), busy_ms.end());
  s.rank = static_cast<int>(it - busy_ms.begin());
  s.busy_ms = *it;
  s.median_ms = median_of({busy_ms.begin(), busy_ms.end()});
  s.ratio = ratio_to(s.busy_ms, s.median_ms);
  return s;
}

StragglerDetector::StragglerDetector(double factor, int window) : factor_(factor), window_(window) {
  TRIDENT_CHECK_MSG(window >= 1, "straggler window " + std::to_string(window) + " must be >= 1");
}

std::optional<std::vector<Straggler>> StragglerDetector::push(std::span<const double> busy_ms,
                                                              std::span<const double> own_ms) {
  if (!enabled()) return std::nullopt;
  const std::size_t n = busy_ms.size();
  if (slow_.empty()) slow_.resize(n);
  TRIDENT_CHECK_MSG(slow_.size() == n, "straggler detector: " + std::to_string(n) +
                                           " ranks, was " + std::to_string(slow_.size()));
  TRIDENT_CHECK_MSG(own_ms.empty() || own_ms.size() == n,
                    "straggler detector: " + std::to_string(own_ms.size()) + " own times for " +
                        std::to_string(n) + " ranks");
  TRIDENT_CHECK_MSG(host_of_.empty() || host_of_.size() == n,
                    "straggler detector: " + std::to_string(host_of_.size()) + " hosts for " +
                        std::to_string(n) + " ranks");
  const double median = median_of({busy_ms.begin(), busy_ms.end()});
  const double limit = factor_ * median;
  // A host is over the factor when every one of its ranks is (the header says why): when
  // its least busy rank is (one pass, not one per rank over the factor).
  if (!host_of_.empty()) {
    host_min_.assign(n, std::numeric_limits<double>::infinity());
    for (std::size_t q = 0; q < n; ++q) {
      const int h = host_of_[q];
      TRIDENT_CHECK_MSG(h >= 0 && static_cast<std::size_t>(h) < n,
                        "straggler detector: host index " + std::to_string(h) + " of rank " +
                            std::to_string(q) + " is not below the rank count " + std::to_string(n));
      double& least = host_min_[static_cast<std::size_t>(h)];
      if (!(busy_ms[q] > least)) least = busy_ms[q];
    }
  }
  for (std::size_t r = 0; r < n; ++r) {
    const double own = own_ms.empty() ? busy_ms[r] : own_ms[r];
    if (!(busy_ms[r] > limit)) continue;
    const bool host_over =
        host_of_.empty() || host_min_[static_cast<std::size_t>(host_of_[r])] > limit;
    if (own > limit || host_over) slow_[r].push_back(ratio_to(busy_ms[r], median));
  }
  if (++steps_ < window_) return std::nullopt;
  std::vector<Straggler> found;
  const int needed = (window_ + 1) / 2;
  for (std::size_t r = 0; r < n; ++r) {
    if (static_cast<int>(slow_[r].size()) >= needed) {
      found.push_back({static_cast<int>(r), static_cast<int>(slow_[r].size()), median_of(slow_[r])});
    }
    slow_[r].clear();
  }
  steps_ = 0;
  std::stable_sort(found.begin(), found.end(), [](const Straggler& a, const Straggler& b) {
    return a.slow_steps > b.slow_steps;
  });
  return found;
}

std::string straggler_text(const std::vector<Straggler>& stragglers,
                           const std::vector<std::string>& hosts, double factor, int window) {
  std::string text;
  for (const Straggler& s : stragglers) {
    if (!text.empty()) text += "; ";
    const bool known = s.rank >= 0 && static_cast<std::size_t>(s.rank) < hosts.size() &&
                       !hosts[static_cast<std::size_t>(s.rank)].empty();
    text += fmt::format("rank {}{} exceeded {:g}x the median rank's busy time in {} of the last "
                        "{} steps (by {:.1f}x in the median of those)",
                        s.rank, known ? " on " + hosts[static_cast<std::size_t>(s.rank)] : "",
                        factor, s.slow_steps, window, s.slow_ratio);
  }
  return text;
}

}  // namespace trident
