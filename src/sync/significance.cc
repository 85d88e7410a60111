#include <cmath>

#include "meridian/optimizer.h"
#include "meridian/sync.h"

namespace meridian {

size_t TakeSignificant(std::span<float> acc, std::span<const float> w,
                       double theta, pb::ThresholdMode mode, uint64_t base,
                       std::vector<uint64_t>* indices,
                       std::vector<float>* values) {
  const auto t = static_cast<float>(theta);
  size_t taken = 0;
  for (size_t i = 0; i < acc.size(); ++i) {
    const float a = acc[i];
    if (a == 0.0f) continue;
    // |acc / w| > theta without dividing; w == 0 is always significant.
    const bool significant =
        mode == pb::ABSOLUTE
            ? std::fabs(a) > t
            : (w[i] == 0.0f || std::fabs(a) > t * std::fabs(w[i]));
    if (!significant) continue;
    indices->push_back(base + i);
    values->push_back(a);
    acc[i] = 0.0f;
    ++taken;
  }
  return taken;
}

ThresholdSchedule::ThresholdSchedule(const pb::SyncConfig& sync,
                                     const pb::OptimizerConfig& optimizer,
                                     uint32_t steps_per_clock)
    : sync_(sync),
      optimizer_(optimizer),
      steps_per_clock_(steps_per_clock == 0 ? 1 : steps_per_clock) {}

double ThresholdSchedule::At(uint64_t clock) const {
  if (clock == 0) clock = 1;
  if (sync_.flush_every() > 0 && clock % sync_.flush_every() == 0) return 0;
  const double theta0 = sync_.threshold();
  switch (sync_.threshold_schedule()) {
    case pb::THRESHOLD_INVERSE_SQRT:
      return theta0 / std::sqrt(static_cast<double>(clock));
    case pb::THRESHOLD_LR_COUPLED: {
      const double lr0 = LearningRateAt(optimizer_, 0);
      const double lr = LearningRateAt(optimizer_, clock * steps_per_clock_);
      return lr0 > 0 ? theta0 * lr / lr0 : theta0;
    }
    case pb::THRESHOLD_CONSTANT:
    case pb::THRESHOLD_SCHEDULE_UNSPECIFIED:
      break;
  }
  return theta0;
}

AdaptiveThreshold::AdaptiveThreshold(double budget_bytes_per_s, double step,
                                     double max_adjustment)
    : budget_(budget_bytes_per_s),
      step_(step),
      max_adjustment_(max_adjustment < 0 ? 0 : max_adjustment) {}

void AdaptiveThreshold::Observe(uint64_t bytes, double seconds) {
  if (seconds <= 0 || budget_ <= 0) return;
  const double usage = static_cast<double>(bytes) / seconds;
  if (usage > 1.1 * budget_) {
    adjustment_ += step_;
  } else if (usage < 0.9 * budget_) {
    adjustment_ -= step_;
  }
  adjustment_ = std::clamp(adjustment_, 0.0, max_adjustment_);
}

void AdaptiveThreshold::ObserveDelivery(uint64_t sent_bytes, double seconds,
                                        bool saturated) {
  if (seconds <= 0) return;
  const double sent_rate = static_cast<double>(sent_bytes) / seconds;
  const bool over_budget = budget_ > 0 && sent_rate > 1.1 * budget_;
  const bool under_budget = budget_ <= 0 || sent_rate < 0.9 * budget_;
  if (saturated || over_budget) {
    adjustment_ += step_;
  } else if (under_budget) {
    adjustment_ -= step_;
  }
  adjustment_ = std::clamp(adjustment_, 0.0, max_adjustment_);
}

}  // namespace meridian
