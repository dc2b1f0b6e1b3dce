#include "data/blend.h"

#include <charconv>
#include <cmath>
#include <numeric>
#include <optional>

#include "core/check.h"

namespace trident {

namespace {

// w = digits · 10^exponent, from the shortest decimal form that reads back as w.
struct Decimal {
  uint64_t digits = 0;
  int exponent = 0;
};

std::optional<Decimal> shortest_decimal(double w) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), w, std::chars_format::scientific);
  if (ec != std::errc()) return std::nullopt;
  const std::string text(buf, end);  // "d[.ddd]e[+-]xx"
  const size_t e = text.find('e');
  if (e == std::string::npos) return std::nullopt;
  Decimal d;
  int fraction_digits = 0;
  bool after_dot = false;
  for (size_t i = 0; i < e; ++i) {
    if (text[i] == '.') {
      after_dot = true;
      continue;
    }
    if (d.digits > (UINT64_MAX - 9) / 10) return std::nullopt;
    d.digits = d.digits * 10 + static_cast<uint64_t>(text[i] - '0');
    if (after_dot) ++fraction_digits;
  }
  int exponent = 0;
  std::from_chars(text.data() + e + 1 + (text[e + 1] == '+'), text.data() + text.size(), exponent);
  d.exponent = exponent - fraction_digits;
  return d;
}

// The weights as exact integer ratios when their decimals allow a period <= the limit.
std::optional<std::vector<uint64_t>> exact_quotas(const std::vector<double>& weights) {
  std::vector<Decimal> decimals;
  int min_exponent = 0;
  for (double w : weights) {
    auto d = shortest_decimal(w);
    if (!d) return std::nullopt;
    min_exponent = decimals.empty() ? d->exponent : std::min(min_exponent, d->exponent);
    decimals.push_back(*d);
  }
  std::vector<uint64_t> q;
  uint64_t sum = 0;
  for (const Decimal& d : decimals) {
    uint64_t v = d.digits;
    for (int i = d.exponent; i > min_exponent; --i) {
      if (v > kMaxBlendPeriod) return std::nullopt;  // already too large to fit
      v *= 10;
    }
    sum += v;
    if (v > kMaxBlendPeriod || sum > uint64_t{1} << 62) return std::nullopt;
    q.push_back(v);
  }
  uint64_t g = 0;
  for (uint64_t v : q) g = std::gcd(g, v);
  sum = 0;
  for (uint64_t& v : q) {
    v /= g;
    sum += v;
  }
  if (sum > kMaxBlendPeriod) return std::nullopt;
  return q;
}

}  // namespace

Result<std::vector<uint64_t>> blend_quotas(const std::vector<double>& weights) {
  if (weights.empty()) return Status::invalid_config("data.train: a blend needs at least one entry");
  if (weights.size() > static_cast<size_t>(kMaxBlendComponents)) {
    return Status::invalid_config("data.train: " + std::to_string(weights.size()) +
                                  " blend entries, at most " +
                                  std::to_string(kMaxBlendComponents));
  }
  double sum = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!(weights[i] > 0) || !std::isfinite(weights[i])) {
      return Status::invalid_config("data.train[" + std::to_string(i) +
                                    "].weight: must be a positive finite number, got " +
                                    std::to_string(weights[i]));
    }
    sum += weights[i];
  }
  if (!std::isfinite(sum)) return Status::invalid_config("data.train: the blend weights sum to infinity");
  if (auto q = exact_quotas(weights)) return *q;
  std::vector<uint64_t> q;
  for (double w : weights) {
    q.push_back(std::max<uint64_t>(
        1, static_cast<uint64_t>(std::llround(w / sum * static_cast<double>(kMaxBlendPeriod)))));
  }
  return q;
}

BlendSchedule::BlendSchedule(std::vector<uint64_t> quotas) : quotas_(std::move(quotas)) {
  TRIDENT_CHECK_MSG(!quotas_.empty() && quotas_.size() <= static_cast<size_t>(kMaxBlendComponents),
                    "blend of " + std::to_string(quotas_.size()) + " components");
  for (uint64_t q : quotas_) {
    TRIDENT_CHECK_MSG(q >= 1, "blend quota 0");
    period_ += q;
  }
  TRIDENT_CHECK_MSG(period_ <= 2 * kMaxBlendPeriod, "blend period " + std::to_string(period_));
  const size_t k = quotas_.size();
  const int64_t D = static_cast<int64_t>(period_);
  component_.resize(period_);
  rank_.resize(period_);
  std::vector<int64_t> count(k, 0);
  for (int64_t t = 0; t < D; ++t) {
    // Deficit after this sample, scaled by D: q_i·(t+1) - D·n_i(t); exact in int64
    // (q_i·(t+1) <= D^2 <= 2^42).
    size_t best = 0;
    int64_t best_deficit = INT64_MIN;
    for (size_t i = 0; i < k; ++i) {
      const int64_t deficit = static_cast<int64_t>(quotas_[i]) * (t + 1) - D * count[i];
      if (deficit > best_deficit) {
        best_deficit = deficit;
        best = i;
      }
    }
    component_[static_cast<size_t>(t)] = static_cast<uint16_t>(best);
    rank_[static_cast<size_t>(t)] = static_cast<uint32_t>(count[best]);
    ++count[best];
  }
  for (size_t i = 0; i < k; ++i) {
    TRIDENT_CHECK_MSG(count[i] == static_cast<int64_t>(quotas_[i]), "blend period is not exact");
  }
}

Result<BlendSchedule> BlendSchedule::from_weights(const std::vector<double>& weights) {
  TRIDENT_ASSIGN_OR_RETURN(std::vector<uint64_t> q, blend_quotas(weights));
  return BlendSchedule(std::move(q));
}

BlendSchedule::Pick BlendSchedule::pick(uint64_t counter) const {
  const uint64_t period = counter / period_, position = counter % period_;
  const int c = component_[position];
  return {c, period * quotas_[static_cast<size_t>(c)] + rank_[position]};
}

}  // namespace trident
