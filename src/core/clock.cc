#include "meridian/core/clock.h"

#include <thread>

namespace meridian {
namespace {

class SteadyClock final : public Clock {
 public:
  Duration Now() const override {
    return std::chrono::duration_cast<Duration>(
        std::chrono::steady_clock::now().time_since_epoch());
  }
  void SleepUntil(Duration deadline) override {
    const Duration now = Now();
    if (deadline > now) std::this_thread::sleep_for(deadline - now);
  }
};

}  // namespace

Clock* SystemClock() {
  static SteadyClock* clock = new SteadyClock();  // never destroyed
  return clock;
}

double UnixSeconds() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

class SystemWallClockImpl final : public WallClock {
 public:
  double UnixSeconds() const override { return ::meridian::UnixSeconds(); }
};

}  // namespace

const WallClock* SystemWallClock() {
  static const SystemWallClockImpl* const clock = new SystemWallClockImpl();
  return clock;
}

Duration ManualClock::Now() const {
  MutexLock lock(&mu_);
  return now_;
}

void ManualClock::SleepUntil(Duration deadline) {
  MutexLock lock(&mu_);
  while (now_ < deadline) cv_.wait(mu_);
}

void ManualClock::Advance(Duration d) {
  {
    MutexLock lock(&mu_);
    if (d > Duration::zero()) now_ += d;  // time never runs backwards
  }
  cv_.notify_all();
}

}  // namespace meridian
