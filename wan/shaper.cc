#include <algorithm>
#include <cmath>
#include <numbers>

#include "wan/shaper.h"

namespace meridian::wan {

double UniformUnit(std::mt19937_64& rng) {
  // 53 random bits -> [0, 1).
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

double StandardNormal(std::mt19937_64& rng) {
  // Box-Muller; 1 - u keeps the logarithm finite.
  const double u1 = 1.0 - UniformUnit(rng);
  const double u2 = UniformUnit(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

Shaper::Shaper(const DirectionModel& model, const Clock* clock)
    : model_(model), clock_(clock), rng_(model.seed) {
  busy_until_ = clock_->Now();
}

void Shaper::SetModel(const DirectionModel& model) {
  // Chunks that departed under the old model keep its timing.
  if (!partitioned_) Depart(clock_->Now());
  if (model.seed != model_.seed) rng_.seed(model.seed);
  model_ = model;
}

uint64_t Shaper::Enqueue(size_t bytes) {
  const uint64_t seq = next_seq_++;
  pacer_.push_back(Waiting{seq, bytes, clock_->Now()});
  in_flight_ += bytes;
  return seq;
}

Duration Shaper::DrawDelay() {
  if (model_.jitter <= Duration::zero()) return model_.latency;
  const double latency = static_cast<double>(model_.latency.count());
  const double jitter = static_cast<double>(model_.jitter.count());
  double delay;
  if (model_.jitter_distribution == pb::JITTER_NORMAL) {
    delay = latency + jitter * StandardNormal(rng_);
  } else {
    delay = latency + jitter * (2.0 * UniformUnit(rng_) - 1.0);
  }
  return Duration(static_cast<int64_t>(std::llround(std::max(0.0, delay))));
}

void Shaper::Depart(Duration now) {
  // Pacer: chunks whose departure time has come enter the delay line.
  while (!pacer_.empty()) {
    const Waiting& head = pacer_.front();
    const Duration departure = std::max(busy_until_, head.arrival);
    if (departure > now) break;
    if (model_.bandwidth_bps > 0) {
      const double serialization_ns =
          static_cast<double>(head.bytes) * 8e9 / model_.bandwidth_bps +
          busy_carry_ns_;
      const double whole = std::floor(serialization_ns);
      busy_carry_ns_ = serialization_ns - whole;
      busy_until_ = departure + Duration(static_cast<int64_t>(whole));
    } else {
      busy_until_ = departure;
    }
    const Duration release = std::max(departure + DrawDelay(), last_release_);
    last_release_ = release;
    delay_.push_back(Released{head.seq, head.bytes, departure, release});
    pacer_.pop_front();
  }
}

size_t Shaper::Poll(std::vector<Released>* out) {
  if (partitioned_) return 0;
  const Duration now = clock_->Now();
  Depart(now);
  // Delay line: FIFO by construction (release times never decrease).
  size_t count = 0;
  while (!delay_.empty() && delay_.front().release <= now) {
    out->push_back(delay_.front());
    delay_.pop_front();
    ++count;
  }
  return count;
}

std::optional<Duration> Shaper::NextEventTime() const {
  if (partitioned_) return std::nullopt;
  std::optional<Duration> next;
  if (!delay_.empty()) next = delay_.front().release;
  if (!pacer_.empty()) {
    const Duration departure = std::max(busy_until_, pacer_.front().arrival);
    if (!next || departure < *next) next = departure;
  }
  return next;
}

void Shaper::Partition() {
  if (partitioned_) return;
  Depart(clock_->Now());
  partitioned_ = true;
  partition_start_ = clock_->Now();
}

void Shaper::Heal() {
  if (!partitioned_) return;
  partitioned_ = false;
  // The link's time stood still during the partition: shift everything
  // that was scheduled by its length.
  const Duration paused = clock_->Now() - partition_start_;
  busy_until_ += paused;
  last_release_ += paused;
  for (Released& chunk : delay_) {
    chunk.departure += paused;
    chunk.release += paused;
  }
}

void Shaper::Delivered(uint64_t bytes) {
  in_flight_ -= std::min(bytes, in_flight_);
}

}  // namespace meridian::wan
