#include <bit>
#include <cmath>
#include <cstdint>

#include "meridian/train/optimizer.h"
#include "meridian/sync/sync.h"

namespace meridian {

namespace {

// Whether (a, w) is significant, without branches (so that a block's test
// vectorises): a != 0 and |a| > t * |w| (RELATIVE; w == 0 always counts)
// or |a| > t (ABSOLUTE). A NaN a is significant only where w == 0, as the
// scalar definition says.
inline uint32_t Significant(float a, float w, float t, bool relative) {
  const float bound = relative ? t * std::fabs(w) : t;
  return static_cast<uint32_t>(a != 0.0f) &
         (static_cast<uint32_t>(relative && w == 0.0f) |
          static_cast<uint32_t>(std::fabs(a) > bound));
}

// Entries tested together before any is taken: a row of a factor matrix,
// and most blocks of a large model hold nothing significant.
constexpr size_t kBlock = 16;

}  // namespace

size_t TakeSignificant(std::span<float> acc, std::span<const float> w,
                       double theta, pb::ThresholdMode mode, uint64_t base,
                       std::vector<uint64_t>* indices,
                       std::vector<float>* values) {
  const auto t = static_cast<float>(theta);
  const bool relative = mode != pb::ABSOLUTE;
  size_t taken = 0;
  // Takes entry begin + j for every bit j set in `bits`.
  const auto take = [&](size_t begin, uint32_t bits) {
    while (bits != 0) {
      const size_t i = begin + static_cast<size_t>(std::countr_zero(bits));
      bits &= bits - 1;
      indices->push_back(base + i);
      values->push_back(acc[i]);
      acc[i] = 0.0f;
      ++taken;
    }
  };
  // Bit j set when entry begin + j (< end) is significant.
  const auto significant_bits = [&](size_t begin, size_t end) {
    uint32_t bits = 0;
    for (size_t i = begin; i < end; ++i) {
      bits |= Significant(acc[i], w[i], t, relative) << (i - begin);
    }
    return bits;
  };
  const size_t whole = acc.size() / kBlock * kBlock;
  for (size_t begin = 0; begin < whole; begin += kBlock) {
    uint32_t count = 0;
    for (size_t i = begin; i < begin + kBlock; ++i) {
      count += Significant(acc[i], w[i], t, relative);
    }
    if (count == 0) continue;
    if (count == kBlock) {  // a whole row: no bit to look up
      for (size_t i = begin; i < begin + kBlock; ++i) {
        indices->push_back(base + i);
        values->push_back(acc[i]);
        acc[i] = 0.0f;
      }
      taken += kBlock;
      continue;
    }
    take(begin, significant_bits(begin, begin + kBlock));
  }
  take(whole, significant_bits(whole, acc.size()));
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
