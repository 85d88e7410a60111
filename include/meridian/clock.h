// Time behind a small interface so that schedulers, pacers and timeouts can
// run on virtual time in tests.
#ifndef MERIDIAN_CLOCK_H_
#define MERIDIAN_CLOCK_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace meridian {

using Duration = std::chrono::nanoseconds;

// Seconds as a double, the unit of configs and reports.
inline double ToSeconds(Duration d) {
  return std::chrono::duration<double>(d).count();
}
inline Duration FromSeconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

// A monotonic clock. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  // Time since an arbitrary fixed epoch; never decreases.
  virtual Duration Now() const = 0;
  // Returns once Now() >= deadline (a real clock sleeps; a manual clock
  // waits until another thread advances it).
  virtual void SleepUntil(Duration deadline) = 0;

  double NowSeconds() const { return ToSeconds(Now()); }
  void SleepFor(Duration d) { SleepUntil(Now() + d); }
};

// The process-wide steady clock. Never null; lives for the whole process.
Clock* SystemClock();

// Virtual time for tests: starts at zero and moves only when told.
class ManualClock final : public Clock {
 public:
  Duration Now() const override;
  void SleepUntil(Duration deadline) override;
  // Moves time forward by `d`; a negative `d` is ignored.
  void Advance(Duration d);
  void AdvanceSeconds(double s) { Advance(FromSeconds(s)); }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Duration now_{0};
};

// Measures elapsed time on a clock from construction or the last Reset().
class Stopwatch {
 public:
  explicit Stopwatch(const Clock* clock = SystemClock())
      : clock_(clock), start_(clock->Now()) {}
  void Reset() { start_ = clock_->Now(); }
  Duration Elapsed() const { return clock_->Now() - start_; }
  double ElapsedSeconds() const { return ToSeconds(Elapsed()); }

 private:
  const Clock* clock_;
  Duration start_;
};

}  // namespace meridian

#endif  // MERIDIAN_CLOCK_H_
