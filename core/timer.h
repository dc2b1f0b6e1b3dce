// Wall-clock timing (steady clock) for progress lines, statistics and benchmarks: the one
// timer of the tree. Host time only: on a device it measures launches unless the caller
// synchronizes first.
#pragma once

#include <chrono>

namespace trident {

class Timer {
 public:
  Timer() : start_(std::chrono::steady_clock::now()) {}
  void reset() { start_ = std::chrono::steady_clock::now(); }
  double elapsed_ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
        .count();
  }
  double elapsed_s() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace trident
