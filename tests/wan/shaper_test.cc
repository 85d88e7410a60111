// The shaper on virtual time: pacing arithmetic, latency and jitter, the
// queue limit, partition and heal, asymmetric links.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "wan/shaper.h"

namespace meridian::wan {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

DirectionModel Model(double bps, Duration latency = Duration::zero(),
                     Duration jitter = Duration::zero(),
                     pb::JitterDistribution distribution = pb::JITTER_UNIFORM) {
  DirectionModel model;
  model.bandwidth_bps = bps;
  model.latency = latency;
  model.jitter = jitter;
  model.jitter_distribution = distribution;
  model.seed = 42;
  return model;
}

// Jumps the clock straight to each next event.
std::vector<Shaper::Released> DrainByEvents(Shaper& shaper,
                                            ManualClock& clock) {
  std::vector<Shaper::Released> out;
  while (shaper.pending_chunks() > 0) {
    shaper.Poll(&out);
    std::optional<Duration> next = shaper.NextEventTime();
    if (!next) break;
    if (*next > clock.Now()) clock.Advance(*next - clock.Now());
  }
  return out;
}

TEST(ShaperTest, EachByteCostsOneOverBandwidth) {
  ManualClock clock;
  Shaper shaper(Model(8e6), &clock);  // 1 byte/us
  for (int i = 0; i < 10; ++i) shaper.Enqueue(1000);
  const auto released = DrainByEvents(shaper, clock);
  ASSERT_EQ(released.size(), 10u);
  for (size_t i = 0; i < released.size(); ++i) {
    EXPECT_EQ(released[i].seq, i);
    // The link is busy 1000 us per chunk; the first leaves at once.
    EXPECT_EQ(released[i].departure, microseconds(1000 * i)) << i;
    EXPECT_EQ(released[i].release, released[i].departure);
  }
}

TEST(ShaperTest, ThroughputOverManyChunksIsExact) {
  ManualClock clock;
  Shaper shaper(Model(100e6), &clock);
  // 10 MB in chunks of 12.5 kB (1 ms each at 100 Mbit/s), enqueued as the
  // queue allows: 0.8 s of link time.
  uint64_t enqueued = 0;
  std::vector<Shaper::Released> out;
  while (enqueued < 10'000'000 || shaper.pending_chunks() > 0) {
    while (enqueued < 10'000'000 && shaper.Room() >= 12'500) {
      shaper.Enqueue(12'500);
      enqueued += 12'500;
    }
    const size_t before = out.size();
    shaper.Poll(&out);
    for (size_t i = before; i < out.size(); ++i) {
      shaper.Delivered(out[i].bytes);
    }
    clock.Advance(microseconds(137));  // a coarse, unaligned timer
  }
  ASSERT_EQ(out.size(), 800u);
  // Departure times do not depend on when Poll ran: the timer error is
  // carried forward, never accumulated.
  EXPECT_EQ(out.back().departure, milliseconds(799));
}

TEST(ShaperTest, LateTimerIsCarriedForward) {
  ManualClock clock;
  Shaper shaper(Model(8e6), &clock);
  for (int i = 0; i < 5; ++i) shaper.Enqueue(1000);
  std::vector<Shaper::Released> out;
  clock.Advance(microseconds(3500));  // the timer fires very late
  shaper.Poll(&out);
  // Chunks 0..3 were due by 3.5 ms; each keeps its own schedule.
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[3].departure, microseconds(3000));
  clock.Advance(microseconds(500));
  shaper.Poll(&out);
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out[4].departure, microseconds(4000));
}

TEST(ShaperTest, IdleLinkEarnsNoCreditBeyondOneChunk) {
  ManualClock clock;
  Shaper shaper(Model(8e6), &clock);
  shaper.Enqueue(1000);
  std::vector<Shaper::Released> out;
  shaper.Poll(&out);
  ASSERT_EQ(out.size(), 1u);
  clock.Advance(milliseconds(100));  // idle for 100 chunk-times
  for (int i = 0; i < 3; ++i) shaper.Enqueue(1000);
  out.clear();
  shaper.Poll(&out);
  // Only the first leaves at once; the others pay their full link time.
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(shaper.NextEventTime(), milliseconds(101));
  clock.Advance(microseconds(999));
  shaper.Poll(&out);
  EXPECT_EQ(out.size(), 1u);
  clock.Advance(microseconds(1));
  shaper.Poll(&out);
  EXPECT_EQ(out.size(), 2u);
}

TEST(ShaperTest, FractionalNanosecondsAreNotLost) {
  ManualClock clock;
  Shaper shaper(Model(3e9), &clock);  // 1 byte = 2.666... ns
  for (int i = 0; i < 3000; ++i) shaper.Enqueue(1);
  const auto out = DrainByEvents(shaper, clock);
  ASSERT_EQ(out.size(), 3000u);
  // 2999 bytes of link time before the last departs: 7997.33 ns.
  EXPECT_NEAR(static_cast<double>(out.back().departure.count()), 7997.0, 1.0);
}

TEST(ShaperTest, UnlimitedBandwidthNeverWaits) {
  ManualClock clock;
  Shaper shaper(Model(0), &clock);
  for (int i = 0; i < 100; ++i) shaper.Enqueue(1 << 20);
  std::vector<Shaper::Released> out;
  shaper.Poll(&out);
  EXPECT_EQ(out.size(), 100u);
}

TEST(ShaperTest, LatencyIsAddedAfterSerialization) {
  ManualClock clock;
  Shaper shaper(Model(8e6, milliseconds(40)), &clock);
  shaper.Enqueue(1000);
  shaper.Enqueue(1000);
  const auto out = DrainByEvents(shaper, clock);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].release, milliseconds(40));
  EXPECT_EQ(out[1].release, milliseconds(41));
  // Nothing is released early.
  ManualClock clock2;
  Shaper shaper2(Model(8e6, milliseconds(40)), &clock2);
  shaper2.Enqueue(10);
  std::vector<Shaper::Released> none;
  clock2.Advance(microseconds(39'999));
  EXPECT_EQ(shaper2.Poll(&none), 0u);
  clock2.Advance(microseconds(1));
  EXPECT_EQ(shaper2.Poll(&none), 1u);
}

// Delays of widely spaced chunks (no FIFO clamping), in ms.
std::vector<double> SpacedDelays(const DirectionModel& model, int n) {
  ManualClock clock;
  Shaper shaper(model, &clock);
  std::vector<double> delays;
  std::vector<Shaper::Released> out;
  for (int i = 0; i < n; ++i) {
    shaper.Enqueue(1);
    const Duration sent = clock.Now();
    while (out.empty()) {
      shaper.Poll(&out);
      if (out.empty()) clock.Advance(*shaper.NextEventTime() - clock.Now());
    }
    delays.push_back(ToSeconds(out[0].release - sent) * 1e3);
    out.clear();
    clock.Advance(milliseconds(200));  // far apart: never reordered
  }
  return delays;
}

void Moments(const std::vector<double>& v, double* mean, double* sd) {
  *mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  double sq = 0;
  for (double x : v) sq += (x - *mean) * (x - *mean);
  *sd = std::sqrt(sq / (v.size() - 1));
}

TEST(ShaperTest, UniformJitterHasTheRightMoments) {
  const auto delays = SpacedDelays(
      Model(0, milliseconds(50), milliseconds(10), pb::JITTER_UNIFORM), 20000);
  double mean, sd;
  Moments(delays, &mean, &sd);
  EXPECT_NEAR(mean, 50.0, 0.15);
  EXPECT_NEAR(sd, 10.0 / std::sqrt(3.0), 0.1);
  EXPECT_GE(*std::min_element(delays.begin(), delays.end()), 40.0);
  EXPECT_LE(*std::max_element(delays.begin(), delays.end()), 60.0);
}

TEST(ShaperTest, NormalJitterHasTheRightMoments) {
  const auto delays = SpacedDelays(
      Model(0, milliseconds(50), milliseconds(10), pb::JITTER_NORMAL), 20000);
  double mean, sd;
  Moments(delays, &mean, &sd);
  EXPECT_NEAR(mean, 50.0, 0.25);
  EXPECT_NEAR(sd, 10.0, 0.2);
  // About 68% within one standard deviation.
  const double within =
      std::count_if(delays.begin(), delays.end(),
                    [](double d) { return std::fabs(d - 50) <= 10; }) /
      static_cast<double>(delays.size());
  EXPECT_NEAR(within, 0.6827, 0.015);
}

TEST(ShaperTest, NormalJitterIsClippedAtZeroDelay) {
  const auto delays = SpacedDelays(
      Model(0, milliseconds(1), milliseconds(10), pb::JITTER_NORMAL), 2000);
  EXPECT_GE(*std::min_element(delays.begin(), delays.end()), 0.0);
}

TEST(ShaperTest, JitterNeverReordersAndIsSeeded) {
  auto run = [](uint64_t seed) {
    ManualClock clock;
    DirectionModel model =
        Model(80e6, milliseconds(20), milliseconds(15), pb::JITTER_UNIFORM);
    model.seed = seed;
    Shaper shaper(model, &clock);
    for (int i = 0; i < 2000; ++i) {
      shaper.Enqueue(1000);
      clock.Advance(microseconds(50));
    }
    return DrainByEvents(shaper, clock);
  };
  const auto a = run(7);
  ASSERT_EQ(a.size(), 2000u);
  for (size_t i = 1; i < a.size(); ++i) {
    EXPECT_EQ(a[i].seq, i);
    EXPECT_GE(a[i].release, a[i - 1].release);
  }
  const auto b = run(7);
  const auto c = run(8);
  bool same = true, different = false;
  for (size_t i = 0; i < a.size(); ++i) {
    same = same && a[i].release == b[i].release;
    different = different || a[i].release != c[i].release;
  }
  EXPECT_TRUE(same) << "same seed, same delays";
  EXPECT_TRUE(different) << "another seed, other delays";
}

TEST(ShaperTest, QueueLimitCountsUntilDelivered) {
  ManualClock clock;
  DirectionModel model = Model(8e6, milliseconds(10));
  model.queue_limit_bytes = 10'000;
  Shaper shaper(model, &clock);
  EXPECT_EQ(shaper.Room(), 10'000u);
  shaper.Enqueue(4000);
  shaper.Enqueue(6000);
  EXPECT_EQ(shaper.Room(), 0u);
  EXPECT_EQ(shaper.in_flight_bytes(), 10'000u);
  const auto out = DrainByEvents(shaper, clock);
  ASSERT_EQ(out.size(), 2u);
  // Released is not delivered: the writer may still be holding them.
  EXPECT_EQ(shaper.Room(), 0u);
  shaper.Delivered(4000);
  EXPECT_EQ(shaper.Room(), 4000u);
  shaper.Delivered(6000);
  EXPECT_EQ(shaper.Room(), 10'000u);
  EXPECT_EQ(shaper.in_flight_bytes(), 0u);
}

TEST(ShaperTest, PartitionHoldsEverythingAndHealResumesInOrder) {
  ManualClock clock;
  Shaper shaper(Model(8e6, milliseconds(30)), &clock);
  for (int i = 0; i < 3; ++i) shaper.Enqueue(1000);  // depart 0, 1, 2 ms
  clock.Advance(microseconds(1500));  // two have departed, in flight
  shaper.Partition();
  EXPECT_FALSE(shaper.NextEventTime().has_value());
  std::vector<Shaper::Released> out;
  clock.Advance(milliseconds(500));
  shaper.Enqueue(1000);  // arrives during the partition
  EXPECT_EQ(shaper.Poll(&out), 0u) << "nothing leaves a partitioned link";
  EXPECT_EQ(shaper.in_flight_bytes(), 4000u);
  shaper.Heal();  // at 501.5 ms
  const auto released = DrainByEvents(shaper, clock);
  ASSERT_EQ(released.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(released[i].seq, i);
  // The link's time stood still for 500 ms: chunks in flight keep the rest
  // of their latency, the waiting one the rest of its serialization.
  EXPECT_EQ(released[0].release, milliseconds(530));
  EXPECT_EQ(released[1].release, milliseconds(531));
  EXPECT_EQ(released[2].release, milliseconds(532));
  // The one that arrived during the partition follows at link rate.
  EXPECT_EQ(released[3].release, milliseconds(533));
}

TEST(ShaperTest, AsymmetricDirectionsAreIndependent) {
  ManualClock clock;
  LinkModel link;
  link.a = "a";
  link.b = "b";
  link.a_to_b = Model(80e6, milliseconds(10));
  link.b_to_a = Model(8e6, milliseconds(40));
  Shaper a_to_b(link.a_to_b, &clock);
  Shaper b_to_a(link.b_to_a, &clock);
  for (int i = 0; i < 100; ++i) {
    a_to_b.Enqueue(1000);
    b_to_a.Enqueue(1000);
  }
  std::vector<Shaper::Released> ab, ba;
  while (a_to_b.pending_chunks() + b_to_a.pending_chunks() > 0) {
    a_to_b.Poll(&ab);
    b_to_a.Poll(&ba);
    clock.Advance(microseconds(100));
  }
  ASSERT_EQ(ab.size(), 100u);
  ASSERT_EQ(ba.size(), 100u);
  // 100 kB: 10 ms at 80 Mbit/s (+10 ms), 100 ms at 8 Mbit/s (+40 ms).
  EXPECT_EQ(ab.back().release, microseconds(9900 + 10'000));
  EXPECT_EQ(ba.back().release, microseconds(99'000 + 40'000));
}

TEST(ShaperTest, SetModelAppliesFromNowOn) {
  ManualClock clock;
  Shaper shaper(Model(8e6, milliseconds(10)), &clock);
  shaper.Enqueue(1000);  // departs at 0 under the old model
  shaper.Enqueue(1000);
  std::vector<Shaper::Released> out;
  shaper.Poll(&out);
  shaper.SetModel(Model(16e6, milliseconds(100)));
  const auto rest = DrainByEvents(shaper, clock);
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0].release, milliseconds(10));  // old latency
  // Departs when the first chunk's 1 ms at the old rate ends; new latency.
  EXPECT_EQ(rest[1].departure, milliseconds(1));
  EXPECT_EQ(rest[1].release, milliseconds(101));
}

TEST(ShaperTest, ZeroByteMarkersKeepTheirPlace) {
  ManualClock clock;
  Shaper shaper(Model(8e6, milliseconds(5)), &clock);
  shaper.Enqueue(1000);
  shaper.Enqueue(0);  // e.g. end of stream
  const auto out = DrainByEvents(shaper, clock);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].seq, 1u);
  EXPECT_EQ(out[1].departure, milliseconds(1));
  EXPECT_EQ(out[1].release, milliseconds(6));
}

TEST(ShaperTest, DistributionHelpersAreInRange) {
  std::mt19937_64 rng(1);
  double sum = 0, sq = 0;
  for (int i = 0; i < 100000; ++i) {
    const double u = UniformUnit(rng);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    const double z = StandardNormal(rng);
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sq += z * z;
  }
  EXPECT_NEAR(sum / 100000, 0.0, 0.02);
  EXPECT_NEAR(sq / 100000, 1.0, 0.02);
}

}  // namespace
}  // namespace meridian::wan
