#include "meridian/ps/param_store.h"
#include "testing/status_matchers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace meridian {
namespace {

// a: 2x3 = 6 elements at [0, 6), b: 4 elements at [6, 10).
ModelLayout TenElements() {
  ModelLayout layout;
  EXPECT_OK(layout.Add("a", {2, 3}));
  EXPECT_OK(layout.Add("b", {4}));
  return layout;
}

ApplyRule Rule(pb::ApplyRule kind, double learning_rate = 1.0,
               double momentum = 0.0, uint32_t workers = 1) {
  ApplyRule rule;
  rule.rule = kind;
  rule.learning_rate = learning_rate;
  rule.momentum = momentum;
  rule.workers = workers;
  return rule;
}

std::vector<float> SnapshotOf(const ParameterStore& store) {
  std::vector<float> out(store.num_elements(), -12345.0f);
  store.Snapshot(out);
  return out;
}

std::vector<float> Iota(size_t n, float first = 1.0f) {
  std::vector<float> values(n);
  std::iota(values.begin(), values.end(), first);
  return values;
}

// ---------------------------------------------------------------------------
// Shards

void ExpectShardsPartitionKeySpace(const ParameterStore& store,
                                   uint32_t expected_shards) {
  ASSERT_EQ(store.num_shards(), expected_shards);
  uint64_t next = 0;
  for (uint32_t s = 0; s < store.num_shards(); ++s) {
    const KeyRange range = store.shard_range(s);
    EXPECT_EQ(range.begin, next) << "shard " << s;
    EXPECT_GT(range.end, range.begin) << "shard " << s << " is empty";
    next = range.end;
  }
  EXPECT_EQ(next, store.num_elements());
}

TEST(ParameterStoreTest, ShardsCoverKeySpaceExactlyOnce) {
  // Requested -> expected (clamped to [1, elements]).
  const std::vector<std::pair<uint32_t, uint32_t>> cases = {
      {0, 1}, {1, 1}, {2, 2}, {3, 3},   {4, 4},   {5, 5},
      {6, 6}, {7, 7}, {9, 9}, {10, 10}, {11, 10}, {1000, 10}};
  for (const auto& [requested, expected] : cases) {
    SCOPED_TRACE("num_shards " + std::to_string(requested));
    const ParameterStore store(TenElements(), requested, ApplyRule());
    ExpectShardsPartitionKeySpace(store, expected);
  }
}

TEST(ParameterStoreTest, ShardsOfALargerModel) {
  ModelLayout layout;
  ASSERT_OK(layout.Add("w", {97, 13}));  // 1261 elements
  for (const uint32_t shards : {1u, 3u, 4u, 8u, 64u, 1000u, 1261u}) {
    SCOPED_TRACE("num_shards " + std::to_string(shards));
    const ParameterStore store(layout, shards, ApplyRule());
    ExpectShardsPartitionKeySpace(store, shards);
  }
}

TEST(ParameterStoreTest, EmptyModel) {
  ParameterStore store(ModelLayout(), 4, ApplyRule());
  EXPECT_EQ(store.num_elements(), 0u);
  EXPECT_EQ(store.num_shards(), 1u);
  EXPECT_EQ(store.shard_range(0).size(), 0u);
  std::vector<float> out;
  EXPECT_EQ(store.Snapshot(out), 0u);
  EXPECT_OK(store.Assign({}));
  EXPECT_EQ(store.Apply({}), 1u);
}

// ---------------------------------------------------------------------------
// Assign / Snapshot / Read

TEST(ParameterStoreTest, StartsAtZero) {
  const ParameterStore store(TenElements(), 3, ApplyRule());
  EXPECT_EQ(store.version(), 0u);
  EXPECT_EQ(SnapshotOf(store), std::vector<float>(10, 0.0f));
}

TEST(ParameterStoreTest, AssignSnapshotAndRead) {
  ParameterStore store(TenElements(), 3, ApplyRule());
  const std::vector<float> values = Iota(10);
  ASSERT_OK(store.Assign(values));
  EXPECT_EQ(SnapshotOf(store), values);
  EXPECT_EQ(store.version(), 0u);  // Assign is not an update

  // A read inside one shard, one across every shard boundary, one at the end.
  std::vector<float> out(2);
  store.Read(1, out);
  EXPECT_EQ(out, (std::vector<float>{2, 3}));
  out.assign(8, 0);
  store.Read(1, out);
  EXPECT_EQ(out, (std::vector<float>{2, 3, 4, 5, 6, 7, 8, 9}));
  out.assign(1, 0);
  store.Read(9, out);
  EXPECT_EQ(out, (std::vector<float>{10}));
  out.clear();
  store.Read(10, out);  // empty read at the end: nothing to do
}

TEST(ParameterStoreTest, AssignRejectsWrongSizeAndKeepsModel) {
  ParameterStore store(TenElements(), 3, ApplyRule());
  ASSERT_OK(store.Assign(Iota(10)));
  const Status status = store.Assign(std::vector<float>(9, 5.0f));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Assign(std::vector<float>(11, 5.0f)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SnapshotOf(store), Iota(10));
}

// ---------------------------------------------------------------------------
// Apply rules

TEST(ApplyRuleTest, ScaleAndFromConfig) {
  EXPECT_EQ(Rule(pb::SUM, 1.0, 0, 4).Scale(), 1.0f);
  EXPECT_EQ(Rule(pb::MEAN, 1.0, 0, 4).Scale(), 0.25f);
  EXPECT_EQ(Rule(pb::MEAN, 0.5, 0, 4).Scale(), 0.125f);
  EXPECT_EQ(Rule(pb::SUM, 0.5, 0, 4).Scale(), 0.5f);

  pb::ServerConfig config;  // documented defaults: MEAN, lr 1, momentum 0
  ApplyRule rule = ApplyRule::FromConfig(config, 0);
  EXPECT_EQ(rule.rule, pb::MEAN);
  EXPECT_EQ(rule.learning_rate, 1.0);
  EXPECT_EQ(rule.momentum, 0.0);
  EXPECT_EQ(rule.workers, 1u);  // never divides by zero

  config.set_apply_rule(pb::SUM);
  config.set_learning_rate(0.25);
  config.set_momentum(0.9);
  rule = ApplyRule::FromConfig(config, 8);
  EXPECT_EQ(rule.rule, pb::SUM);
  EXPECT_EQ(rule.learning_rate, 0.25);
  EXPECT_EQ(rule.momentum, 0.9);
  EXPECT_EQ(rule.workers, 8u);
}

TEST(ParameterStoreTest, ApplySumAddsUpdates) {
  ParameterStore store(TenElements(), 3, Rule(pb::SUM));
  ASSERT_OK(store.Assign(Iota(10)));
  const std::vector<float> ua = {1, 1, 1, 1, 1, 1};
  const std::vector<float> ub = {10, 20, 30, 40};
  const std::vector<UpdateSegment> update = {{0, ua}, {6, ub}};
  EXPECT_EQ(store.Apply(update), 1u);
  EXPECT_EQ(SnapshotOf(store),
            (std::vector<float>{2, 3, 4, 5, 6, 7, 17, 28, 39, 50}));
  EXPECT_EQ(store.Apply(update), 2u);
  EXPECT_EQ(SnapshotOf(store),
            (std::vector<float>{3, 4, 5, 6, 7, 8, 27, 48, 69, 90}));
  EXPECT_EQ(store.version(), 2u);
}

TEST(ParameterStoreTest, ApplyMeanDividesByWorkers) {
  ParameterStore store(TenElements(), 2, Rule(pb::MEAN, 1.0, 0.0, 4));
  const std::vector<float> u = {4, 8, -4, 2, 0, 1, 12, 16, 20, 400};
  const std::vector<UpdateSegment> update = {{0, u}};
  store.Apply(update);
  EXPECT_EQ(SnapshotOf(store),
            (std::vector<float>{1, 2, -1, 0.5f, 0, 0.25f, 3, 4, 5, 100}));
  store.Apply(update);
  EXPECT_EQ(SnapshotOf(store),
            (std::vector<float>{2, 4, -2, 1, 0, 0.5f, 6, 8, 10, 200}));
}

TEST(ParameterStoreTest, ApplyScalesByLearningRate) {
  // SUM with lr 0.5: w += 0.5 u.
  ParameterStore sum(TenElements(), 3, Rule(pb::SUM, 0.5));
  const std::vector<float> u(10, 6.0f);
  const std::vector<UpdateSegment> update = {{0, u}};
  sum.Apply(update);
  EXPECT_EQ(SnapshotOf(sum), std::vector<float>(10, 3.0f));

  // MEAN with lr 0.5 over 3 workers: w += u / 6.
  ParameterStore mean(TenElements(), 3, Rule(pb::MEAN, 0.5, 0.0, 3));
  mean.Apply(update);
  mean.Apply(update);
  EXPECT_EQ(SnapshotOf(mean), std::vector<float>(10, 2.0f));
}

TEST(ParameterStoreTest, ApplyWithMomentumByHand) {
  // mu = 0.5, s = lr / M = 1 / 2 (MEAN over two workers).
  ParameterStore store(TenElements(), 3, Rule(pb::MEAN, 1.0, 0.5, 2));
  std::vector<float> w = Iota(10);
  ASSERT_OK(store.Assign(w));
  std::vector<float> v(10, 0.0f);
  // Values chosen so that every intermediate is exact in float.
  const std::vector<std::vector<float>> updates = {
      std::vector<float>(10, 8.0f),
      {4, 0, -8, 2, 6, 10, -2, 16, 0, 1},
      std::vector<float>(10, 0.0f),
      {-16, 32, 8, -4, 0, 2, 4, 6, 8, 10},
  };
  for (size_t step = 0; step < updates.size(); ++step) {
    for (size_t i = 0; i < 10; ++i) {
      v[i] = 0.5f * v[i] + 0.5f * updates[step][i];
      w[i] += v[i];
    }
    const std::vector<UpdateSegment> update = {{0, updates[step]}};
    EXPECT_EQ(store.Apply(update), step + 1);
    EXPECT_EQ(SnapshotOf(store), w) << "after update " << step + 1;
  }
  // Spot-check the hand computation for element 0 (u: 8, 4, 0, -16):
  // v: 4, 4, 2, -7; w: 1 + 4 + 4 + 2 - 7 = 4.
  EXPECT_EQ(w[0], 4.0f);
}

TEST(ParameterStoreTest, AssignResetsMomentum) {
  ParameterStore store(TenElements(), 2, Rule(pb::SUM, 1.0, 0.5));
  const std::vector<float> u(10, 2.0f);
  const std::vector<UpdateSegment> update = {{0, u}};
  store.Apply(update);  // v = 2
  store.Apply(update);  // v = 3
  ASSERT_OK(store.Assign(std::vector<float>(10, 1.0f)));
  store.Apply(update);  // v = 0.5 * 0 + 2 = 2 after the reset
  EXPECT_EQ(SnapshotOf(store), std::vector<float>(10, 3.0f));
}

TEST(ParameterStoreTest, UpdatesSpanningShardBoundaries) {
  // Shards of 10 elements in 3: [0,4) [4,7) [7,10) or similar; the segments
  // below cross every boundary whatever the split.
  ParameterStore store(TenElements(), 3, Rule(pb::SUM));
  const std::vector<float> first = Iota(7, 1.0f);     // elements 2..8
  const std::vector<float> second = {100, 200, 300};  // elements 3..5
  const std::vector<float> third = {1000};            // element 9
  const std::vector<UpdateSegment> update = {
      {2, first}, {3, second}, {9, third}};
  store.Apply(update);
  EXPECT_EQ(SnapshotOf(store),
            (std::vector<float>{0, 0, 1, 102, 203, 304, 5, 6, 7, 1000}));
  // Each single element on its own.
  for (uint64_t i = 0; i < 10; ++i) {
    const std::vector<float> one = {0.5f};
    const std::vector<UpdateSegment> single = {{i, one}};
    store.Apply(single);
  }
  EXPECT_EQ(SnapshotOf(store),
            (std::vector<float>{0.5f, 0.5f, 1.5f, 102.5f, 203.5f, 304.5f, 5.5f,
                                6.5f, 7.5f, 1000.5f}));
  EXPECT_EQ(store.version(), 11u);
}

TEST(ParameterStoreTest, SnapshotReturnsVersionAndClampsOutput) {
  ParameterStore store(TenElements(), 4, Rule(pb::SUM));
  const std::vector<float> u(10, 1.0f);
  const std::vector<UpdateSegment> update = {{0, u}};
  store.Apply(update);
  store.Apply(update);
  store.Apply(update);
  std::vector<float> out(10);
  EXPECT_EQ(store.Snapshot(out), 3u);
  EXPECT_EQ(out, std::vector<float>(10, 3.0f));
  // A larger buffer: only the model's part is written.
  std::vector<float> larger(12, -1.0f);
  EXPECT_EQ(store.Snapshot(larger), 3u);
  EXPECT_EQ(larger[9], 3.0f);
  EXPECT_EQ(larger[10], -1.0f);
  EXPECT_EQ(larger[11], -1.0f);
}

// ---------------------------------------------------------------------------
// UpdateAccumulator

TEST(UpdateAccumulatorTest, SumsAndClears) {
  UpdateAccumulator accumulator(10);
  EXPECT_EQ(accumulator.count(), 0u);
  const std::vector<float> a = {1, 2, 3};
  const std::vector<float> b = {10, 10};
  const std::vector<float> c(10, 0.5f);
  accumulator.Add(std::vector<UpdateSegment>{{0, a}, {8, b}});
  accumulator.Add(std::vector<UpdateSegment>{{1, a}});
  accumulator.Add(std::vector<UpdateSegment>{{0, c}});
  EXPECT_EQ(accumulator.count(), 3u);

  std::vector<UpdateSegment> segments = accumulator.Segments();
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments[0].offset, 0u);
  EXPECT_EQ(
      std::vector<float>(segments[0].values.begin(), segments[0].values.end()),
      (std::vector<float>{1.5f, 3.5f, 5.5f, 3.5f, 0.5f, 0.5f, 0.5f, 0.5f, 10.5f,
                          10.5f}));

  // Applied as one update with MEAN over two workers.
  ParameterStore store(TenElements(), 3, Rule(pb::MEAN, 1.0, 0.0, 2));
  EXPECT_EQ(store.Apply(segments), 1u);
  EXPECT_EQ(SnapshotOf(store),
            (std::vector<float>{0.75f, 1.75f, 2.75f, 1.75f, 0.25f, 0.25f, 0.25f,
                                0.25f, 5.25f, 5.25f}));

  accumulator.Clear();
  EXPECT_EQ(accumulator.count(), 0u);
  segments = accumulator.Segments();
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(
      std::vector<float>(segments[0].values.begin(), segments[0].values.end()),
      std::vector<float>(10, 0.0f));

  // Usable again after Clear.
  accumulator.Add(std::vector<UpdateSegment>{{9, std::vector<float>{2.0f}}});
  EXPECT_EQ(accumulator.count(), 1u);
  EXPECT_EQ(accumulator.Segments()[0].values[9], 2.0f);
  EXPECT_EQ(accumulator.Segments()[0].values[8], 0.0f);
}

// ---------------------------------------------------------------------------
// Concurrency

// Appliers add 1.0 to every element, one segment per tensor (as a worker's
// commit arrives), while readers take snapshots. Shards straddle the tensor
// boundary, so a shard is touched by two segments of the same update.
TEST(ParameterStoreTest, ConcurrentApplyAndSnapshotNeverTearAShard) {
  ModelLayout layout;
  ASSERT_OK(layout.Add("w", {30, 20}));  // [0, 600)
  ASSERT_OK(layout.Add("b", {401}));     // [600, 1001)
  constexpr uint32_t kShards = 7;
  constexpr int kAppliers = 3;
  constexpr int kAppliesEach = 50000;
  ParameterStore store(layout, kShards, Rule(pb::SUM));
  ASSERT_EQ(store.num_shards(), kShards);
  const uint64_t n = store.num_elements();

  const std::vector<float> ones(n, 1.0f);
  const std::vector<UpdateSegment> update = {
      {0, std::span<const float>(ones).first(600)},
      {600, std::span<const float>(ones).subspan(600)}};

  std::atomic<int> running{kAppliers};
  std::vector<std::thread> appliers;
  for (int t = 0; t < kAppliers; ++t) {
    appliers.emplace_back([&] {
      for (int i = 0; i < kAppliesEach; ++i) store.Apply(update);
      --running;
    });
  }

  int snapshots = 0;
  int torn = 0;
  int behind_version = 0;
  int went_back = 0;
  std::vector<float> out(n);
  std::vector<float> previous(n, 0.0f);
  do {
    const uint64_t version = store.Snapshot(out);
    ++snapshots;
    for (uint32_t s = 0; s < store.num_shards(); ++s) {
      const KeyRange range = store.shard_range(s);
      const float first = out[range.begin];
      for (uint64_t i = range.begin; i < range.end; ++i) {
        if (out[i] != first) {
          ++torn;
          break;
        }
      }
      // The version is read before copying and bumped after applying, so
      // every shard has seen at least `version` updates.
      if (first < static_cast<float>(version)) ++behind_version;
    }
    for (uint64_t i = 0; i < n; ++i) {
      if (out[i] < previous[i]) ++went_back;
    }
    previous = out;
  } while (running.load() > 0);
  for (std::thread& thread : appliers) thread.join();

  EXPECT_GT(snapshots, 0);
  EXPECT_EQ(torn, 0) << "of " << snapshots << " snapshots";
  EXPECT_EQ(behind_version, 0);
  EXPECT_EQ(went_back, 0);
  constexpr uint64_t kTotal = uint64_t{kAppliers} * kAppliesEach;
  EXPECT_EQ(store.version(), kTotal);
  EXPECT_EQ(SnapshotOf(store),
            std::vector<float>(n, static_cast<float>(kTotal)));
}

TEST(ParameterStoreTest, ConcurrentAppliesSumExactlyWithMomentumOff) {
  // Different threads, different values: the final model is the exact sum.
  ParameterStore store(TenElements(), 4, Rule(pb::MEAN, 1.0, 0.0, 4));
  constexpr int kAppliesEach = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&store, t] {
      // Thread t adds 4 * (t + 1) (scaled to t + 1) to elements t..t+6.
      const std::vector<float> values(7, 4.0f * static_cast<float>(t + 1));
      const std::vector<UpdateSegment> update = {
          {static_cast<uint64_t>(t), values}};
      for (int i = 0; i < kAppliesEach; ++i) store.Apply(update);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(store.version(), 4u * kAppliesEach);
  std::vector<float> expected(10, 0.0f);
  for (int t = 0; t < 4; ++t) {
    for (int i = t; i < t + 7; ++i) {
      expected[i] += static_cast<float>((t + 1) * kAppliesEach);
    }
  }
  EXPECT_EQ(SnapshotOf(store), expected);
}

// sync.own_changes WITH_PEERS: Apply's change (after the rule and
// momentum) goes to the held buffer and the accumulators, not the model;
// TakeHeld moves it out, AddHeldTo copies it.
TEST(ParameterStoreTest, HeldOwnChangesStayOutOfTheModelUntilTaken) {
  ParameterStore store(TenElements(), 3, Rule(pb::MEAN, 1.0, 0.5, 2));
  const size_t acc = store.AddAccumulator();
  store.HoldOwnChanges();
  ASSERT_TRUE(store.holds_own_changes());
  std::vector<float> initial(10);
  std::iota(initial.begin(), initial.end(), 1.0f);
  ASSERT_OK(store.Assign(initial));
  const std::vector<float> u(10, 2.0f);
  const UpdateSegment all{0, u};
  std::vector<float> reply(10, -1.0f);
  const ReadSegment read{0, reply};
  store.Apply(std::span<const UpdateSegment>(&all, 1),
              std::span<const ReadSegment>(&read, 1));
  store.Apply(std::span<const UpdateSegment>(&all, 1));
  // The model, and the commit's read-back, are untouched.
  EXPECT_EQ(SnapshotOf(store), initial);
  EXPECT_EQ(reply, initial);
  // v = 0.5 v + 2 / 2: 1, then 1.5; the accumulator has both.
  EXPECT_EQ(store.CopyAccumulator(acc), std::vector<float>(10, 2.5f));
  std::vector<float> copy(10, 1.0f);
  store.AddHeldTo(copy);
  EXPECT_EQ(copy, std::vector<float>(10, 3.5f));
  std::vector<float> held(10, -1.0f);
  store.TakeHeld(held);
  EXPECT_EQ(held, std::vector<float>(10, 2.5f));
  store.TakeHeld(held);
  EXPECT_EQ(held, std::vector<float>(10, 0.0f));
  // A peer's change still reaches the model at once.
  store.ApplyExternal(std::span<const UpdateSegment>(&all, 1));
  std::vector<float> expected = initial;
  for (float& value : expected) value += 2.0f;
  EXPECT_EQ(SnapshotOf(store), expected);
}

// sync.own_changes AS_SENT: TakeHeld with the peers' accumulators moves
// only what every peer was sent; what the peer sent the least still waits
// for stays held, and is taken once it is sent.
TEST(ParameterStoreTest, HeldOwnChangesAreTakenAsTheyAreSentToEveryPeer) {
  ParameterStore store(TenElements(), 3, Rule(pb::SUM));
  const size_t to_b = store.AddAccumulator();
  const size_t to_c = store.AddAccumulator();
  store.HoldOwnChanges();
  const std::vector<float> u(10, 2.0f);
  const UpdateSegment all{0, u};
  store.Apply(std::span<const UpdateSegment>(&all, 1));
  // Sent: elements 0-4 to b (all of it); to c, elements 2 and 3 (1.5 of
  // 2, the rest a coding's residual) and 5 and 6 (all of it).
  store.VisitAccumulator(to_b, [](const KeyRange& range, auto,
                                  std::span<float> acc) {
    for (uint64_t i = range.begin; i < range.end && i < 5; ++i) {
      acc[i - range.begin] = 0.0f;
    }
  });
  store.VisitAccumulator(to_c, [](const KeyRange& range, auto,
                                  std::span<float> acc) {
    for (uint64_t i = range.begin; i < range.end; ++i) {
      if (i == 2 || i == 3) acc[i - range.begin] = 0.5f;
      if (i == 5 || i == 6) acc[i - range.begin] = 0.0f;
    }
  });
  const std::vector<size_t> peers{to_b, to_c};
  std::vector<float> taken(10, -1.0f);
  store.TakeHeld(taken, peers);
  // Sent to both: 2 and 3 (1.5 each, c's residual 0.5 held); 4 went to b
  // only, 5 and 6 to c only, 7-9 to nobody: none of it taken.
  const std::vector<float> first{0, 0, 1.5f, 1.5f, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(taken, first);
  std::vector<float> held(10, 0.0f);
  store.AddHeldTo(held);
  const std::vector<float> still{2, 2, 0.5f, 0.5f, 2, 2, 2, 2, 2, 2};
  EXPECT_EQ(held, still);
  // The rest is sent to both: all of it is taken, nothing stays.
  for (size_t id : peers) {
    store.VisitAccumulator(id, [](const KeyRange&, auto, std::span<float> acc) {
      std::fill(acc.begin(), acc.end(), 0.0f);
    });
  }
  store.TakeHeld(taken, peers);
  EXPECT_EQ(taken, still);
  store.TakeHeld(taken, peers);
  EXPECT_EQ(taken, std::vector<float>(10, 0.0f));
  // The model never moved: what was taken is the caller's to apply.
  EXPECT_EQ(SnapshotOf(store), std::vector<float>(10, 0.0f));
}

}  // namespace
}  // namespace meridian
