#include "meridian/core/clock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

namespace meridian {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(DurationTest, SecondsConversions) {
  EXPECT_EQ(FromSeconds(1.5), milliseconds(1500));
  EXPECT_EQ(FromSeconds(0), Duration(0));
  EXPECT_EQ(FromSeconds(1e-9), Duration(1));
  EXPECT_DOUBLE_EQ(ToSeconds(milliseconds(250)), 0.25);
  EXPECT_DOUBLE_EQ(ToSeconds(seconds(-2)), -2.0);
}

TEST(ManualClockTest, StartsAtZeroAndAdvances) {
  ManualClock clock;
  EXPECT_EQ(clock.Now(), Duration(0));
  clock.Advance(milliseconds(1500));
  EXPECT_EQ(clock.Now(), milliseconds(1500));
  clock.AdvanceSeconds(0.25);
  EXPECT_EQ(clock.Now(), milliseconds(1750));
  EXPECT_DOUBLE_EQ(clock.NowSeconds(), 1.75);
}

TEST(ManualClockTest, SleepUntilThePastReturnsAtOnce) {
  ManualClock clock;
  clock.Advance(seconds(5));
  clock.SleepUntil(seconds(3));
  clock.SleepUntil(seconds(5));
  clock.SleepFor(Duration(0));
  EXPECT_EQ(clock.Now(), seconds(5));  // sleeping never moves a manual clock
}

TEST(ManualClockTest, SleepUntilWaitsForAnotherThreadToAdvance) {
  ManualClock clock;
  clock.Advance(seconds(1));
  std::promise<Duration> woke;
  std::future<Duration> woke_at = woke.get_future();
  std::thread sleeper([&] {
    clock.SleepUntil(seconds(10));
    woke.set_value(clock.Now());
  });

  EXPECT_EQ(woke_at.wait_for(milliseconds(50)), std::future_status::timeout);
  clock.Advance(seconds(5));  // t = 6 s: still before the deadline
  EXPECT_EQ(woke_at.wait_for(milliseconds(50)), std::future_status::timeout);
  clock.Advance(seconds(5));  // t = 11 s
  ASSERT_EQ(woke_at.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_EQ(woke_at.get(), seconds(11));
  sleeper.join();
}

TEST(ManualClockTest, SleepForIsRelativeToNow) {
  ManualClock clock;
  clock.Advance(seconds(100));
  std::promise<void> woke;
  std::future<void> done = woke.get_future();
  std::thread sleeper([&] {
    clock.SleepFor(seconds(2));
    woke.set_value();
  });
  // Advance only after the sleeper computed its deadline (100 + 2): wait
  // until it is blocked, i.e. not finished after a short real-time pause.
  EXPECT_EQ(done.wait_for(milliseconds(50)), std::future_status::timeout);
  clock.Advance(seconds(1));
  EXPECT_EQ(done.wait_for(milliseconds(50)), std::future_status::timeout);
  clock.Advance(seconds(1));
  EXPECT_EQ(done.wait_for(seconds(10)), std::future_status::ready);
  sleeper.join();
}

TEST(StopwatchTest, MeasuresManualTime) {
  ManualClock clock;
  clock.Advance(seconds(7));
  Stopwatch watch(&clock);
  EXPECT_EQ(watch.Elapsed(), Duration(0));
  clock.Advance(seconds(3));
  EXPECT_EQ(watch.Elapsed(), seconds(3));
  EXPECT_DOUBLE_EQ(watch.ElapsedSeconds(), 3.0);
  watch.Reset();
  EXPECT_EQ(watch.Elapsed(), Duration(0));
  clock.AdvanceSeconds(1.5);
  EXPECT_DOUBLE_EQ(watch.ElapsedSeconds(), 1.5);
}

TEST(SystemClockTest, IsASingleMonotonicClock) {
  Clock* clock = SystemClock();
  ASSERT_NE(clock, nullptr);
  EXPECT_EQ(clock, SystemClock());
  const Duration before = clock->Now();
  clock->SleepFor(milliseconds(5));
  const Duration after = clock->Now();
  EXPECT_GE(after - before, milliseconds(5));

  Stopwatch watch;  // defaults to the system clock
  clock->SleepUntil(clock->Now() + milliseconds(2));
  EXPECT_GE(watch.Elapsed(), milliseconds(2));
  clock->SleepUntil(before);  // in the past: returns at once
}

}  // namespace
}  // namespace meridian
