#include "meridian/clock.h"

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

Duration ManualClock::Now() const {
  std::lock_guard<std::mutex> lock(mu_);
  return now_;
}

void ManualClock::SleepUntil(Duration deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return now_ >= deadline; });
}

void ManualClock::Advance(Duration d) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (d > Duration::zero()) now_ += d;  // time never runs backwards
  }
  cv_.notify_all();
}

}  // namespace meridian
