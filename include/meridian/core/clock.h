// Time behind a small interface so that schedulers, pacers and timeouts can
// run on virtual time in tests.
#ifndef MERIDIAN_CORE_CLOCK_H_
#define MERIDIAN_CORE_CLOCK_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "meridian/core/mutex.h"
#include "meridian/core/thread_annotations.h"

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

// Seconds since the Unix epoch (the wall clock, which may jump): for
// timestamps that other processes and people read (fault events, logs),
// never for measuring intervals.
double UnixSeconds();

// The wall clock behind an interface, so that tests can fix the timestamps
// of fault events (the monotonic Clock times everything else).
// Implementations are thread-safe.
class WallClock {
 public:
  virtual ~WallClock() = default;
  // Seconds since the Unix epoch.
  virtual double UnixSeconds() const = 0;
};

// The system's wall clock (::meridian::UnixSeconds). Never null; lives for
// the whole process.
const WallClock* SystemWallClock();

// Virtual time for tests: starts at zero and moves only when told.
// Thread-safe: typically the test thread advances it while the threads
// under test read it and sleep on it.
class ManualClock final : public Clock {
 public:
  Duration Now() const override;
  void SleepUntil(Duration deadline) override;
  // Moves time forward by `d`; a negative `d` is ignored.
  void Advance(Duration d);
  void AdvanceSeconds(double s) { Advance(FromSeconds(s)); }

 private:
  mutable Mutex mu_;
  std::condition_variable_any cv_;  // signalled when now_ moves
  Duration now_ GUARDED_BY(mu_) = Duration::zero();
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

#endif  // MERIDIAN_CORE_CLOCK_H_
