// DiLoCo's outer steps (src/sync/outer_steps.h): the Nesterov arithmetic
// against a hand computation, MODEL_AVERAGING as its special case, round
// bookkeeping, what a peer may not send, fragments, the checkpoint round
// trip, the adaptive period (SkewScout's knob) agreed from proposals, and
// SparseLoCo's error feedback (top-k + int2 messages, the residual).

#include "sync/outer_steps.h"
#include "meridian/compression/compression.h"
#include "testing/status_matchers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

namespace meridian {
namespace {

OuterStepOptions Options(uint32_t peers, uint32_t period = 10,
                         uint32_t fragments = 1) {
  OuterStepOptions options;
  options.period = period;
  options.fragments = fragments;
  options.lr = 0.5;
  options.momentum = 0.9;
  options.nesterov = true;
  options.peers = peers;
  return options;
}

OuterSteps Make(const OuterStepOptions& options, uint64_t elements) {
  Result<OuterSteps> steps = OuterSteps::Create(options, elements);
  EXPECT_OK(steps);
  return std::move(*steps);
}

// What a site's checkpoint keeps of `steps`: the bookkeeping and the
// arrays, taken together.
std::pair<pb::OuterStepCheckpoint, Checkpoint> Save(const OuterSteps& steps) {
  std::pair<pb::OuterStepCheckpoint, Checkpoint> saved;
  steps.SaveTo(&saved.first);
  steps.AppendArrays(&saved.second.arrays);
  return saved;
}

TEST(OuterStepsTest, RefusesBadOptions) {
  EXPECT_FALSE(OuterSteps::Create(Options(1, 0), 8).ok());
  EXPECT_FALSE(OuterSteps::Create(Options(1, 10, 3), 8).ok());   // 3 ∤ 10
  EXPECT_FALSE(OuterSteps::Create(Options(1, 10, 10), 8).ok());  // > model
  EXPECT_FALSE(OuterSteps::Create(Options(0), 8).ok());
  OuterStepOptions options = Options(1);
  options.momentum = 1.0;
  EXPECT_FALSE(OuterSteps::Create(options, 8).ok());
  options = Options(1);
  options.lr = 0;
  EXPECT_FALSE(OuterSteps::Create(options, 8).ok());
}

// MODEL_AVERAGING's options: one round replaces the anchor by the mean of
// the three sites' models, and this site's model becomes that mean plus
// what its workers committed after the round started.
TEST(OuterStepsTest, ModelAveragingMakesTheAnchorTheMeanOfTheModels) {
  pb::SyncConfig sync;
  sync.set_kind(pb::MODEL_AVERAGING);
  sync.set_averaging_period(4);
  sync.mutable_diloco()->set_outer_lr(0.7);  // not DiLoCo's: ignored
  ASSERT_TRUE(HasOuterRounds(pb::MODEL_AVERAGING));
  ASSERT_FALSE(HasOuterRounds(pb::GAIA));
  OuterSteps steps = Make(OuterStepOptionsFrom(sync, /*peers=*/2), 2);
  EXPECT_EQ(steps.options().lr, 1.0);
  EXPECT_EQ(steps.options().momentum, 0.0);
  EXPECT_EQ(steps.options().fragments, 1u);
  steps.Start(std::vector<float>{1.0f, 1.0f});
  ASSERT_EQ(steps.FragmentDueAt(4), 0u);
  const std::vector<float> own = {2.0f, 0.0f};
  std::vector<float> delta;
  steps.OuterGradient(0, own, &delta);
  ASSERT_OK(steps.AddOwn(4, delta));
  // The peers' models: {0, 3} and {4, 0}; Δ = anchor - model.
  ASSERT_OK(steps.AddPeer(4, 0, std::vector<float>{1.0f, -2.0f}, 4));
  ASSERT_OK(steps.AddPeer(4, 1, std::vector<float>{-3.0f, 1.0f}, 4));
  std::optional<OuterSteps::Step> step = steps.CloseReady();
  ASSERT_TRUE(step);
  // mean = {(2 + 0 + 4) / 3, (0 + 3 + 0) / 3} = {2, 1}.
  EXPECT_NEAR(steps.anchor()[0], 2.0f, 1e-6);
  EXPECT_NEAR(steps.anchor()[1], 1.0f, 1e-6);
  // A commit of {+0.5, 0} after the round started is kept.
  const std::vector<float> now = {own[0] + 0.5f, own[1]};
  EXPECT_NEAR(now[0] + step->correction[0], 2.5f, 1e-6);
  EXPECT_NEAR(now[1] + step->correction[1], 1.0f, 1e-6);
  // No momentum carries into the next round: equal models stay put.
  steps.OuterGradient(0, steps.anchor(), &delta);
  ASSERT_OK(steps.AddOwn(8, delta));
  ASSERT_OK(steps.AddPeer(8, 0, std::vector<float>{0.0f, 0.0f}, 8));
  ASSERT_OK(steps.AddPeer(8, 1, std::vector<float>{0.0f, 0.0f}, 8));
  ASSERT_TRUE(steps.CloseReady());
  EXPECT_NEAR(steps.anchor()[0], 2.0f, 1e-6);
  EXPECT_NEAR(steps.anchor()[1], 1.0f, 1e-6);
}

TEST(OuterStepsTest, TwoRoundsOfNesterovMatchAHandComputation) {
  OuterSteps steps = Make(Options(/*peers=*/1), 2);
  steps.Start(std::vector<float>{1.0f, -2.0f});
  ASSERT_FALSE(steps.FragmentDueAt(5));
  ASSERT_EQ(steps.FragmentDueAt(10), 0u);

  // Round 10: this site moved to {0.8, -1.9}, the peer to {0.6, -2.3}.
  std::vector<float> delta;
  steps.OuterGradient(0, std::vector<float>{0.8f, -1.9f}, &delta);
  EXPECT_FLOAT_EQ(delta[0], 0.2f);
  EXPECT_FLOAT_EQ(delta[1], -0.1f);
  ASSERT_OK(steps.AddOwn(10, delta));
  EXPECT_TRUE(steps.Open(0));
  EXPECT_FALSE(steps.CloseReady());  // the peer's Δ is missing
  ASSERT_OK(steps.AddPeer(10, 0, std::vector<float>{0.4f, 0.3f}, 10));
  std::optional<OuterSteps::Step> step = steps.CloseReady();
  ASSERT_TRUE(step);
  // mean Δ = {0.3, 0.1}; m = {0.3, 0.1}; direction = mean + 0.9 m =
  // {0.57, 0.19}; anchor = {1 - 0.285, -2 - 0.095}.
  EXPECT_NEAR(steps.anchor()[0], 0.715f, 1e-6);
  EXPECT_NEAR(steps.anchor()[1], -2.095f, 1e-6);
  EXPECT_NEAR(steps.momentum()[0], 0.3f, 1e-6);
  // Correction = new anchor - base, base = anchor - Δ = own model.
  EXPECT_NEAR(step->correction[0], 0.715f - 0.8f, 1e-6);
  EXPECT_NEAR(step->correction[1], -2.095f + 1.9f, 1e-6);
  EXPECT_EQ(steps.steps(), 1u);
  EXPECT_FALSE(steps.Open(0));

  // Round 20: both Δ = {0.1, 0}: m = 0.9 m + 0.1 = {0.37, 0.09}.
  ASSERT_OK(steps.AddPeer(20, 0, std::vector<float>{0.1f, 0.0f}, 15));
  ASSERT_OK(steps.AddOwn(20, std::vector<float>{0.1f, 0.0f}));
  step = steps.CloseReady();
  ASSERT_TRUE(step);
  EXPECT_NEAR(steps.momentum()[0], 0.37f, 1e-6);
  EXPECT_NEAR(steps.momentum()[1], 0.09f, 1e-6);
  EXPECT_NEAR(steps.anchor()[0], 0.715f - 0.5f * (0.1f + 0.9f * 0.37f), 1e-6);
  EXPECT_NEAR(steps.anchor()[1], -2.095f - 0.5f * (0.9f * 0.09f), 1e-6);
}

TEST(OuterStepsTest, PlainMomentumWithoutNesterov) {
  OuterStepOptions options = Options(1);
  options.nesterov = false;
  OuterSteps steps = Make(options, 1);
  steps.Start(std::vector<float>{0.0f});
  ASSERT_OK(steps.AddOwn(10, std::vector<float>{1.0f}));
  ASSERT_OK(steps.AddPeer(10, 0, std::vector<float>{1.0f}, 10));
  ASSERT_TRUE(steps.CloseReady());
  EXPECT_NEAR(steps.anchor()[0], -0.5f, 1e-6);  // lr × m, m = 1
}

TEST(OuterStepsTest, WhatTheCodingLostAndLaterCommitsStayLocal) {
  OuterSteps steps = Make(Options(1), 1);
  steps.Start(std::vector<float>{0.0f});
  // The model was at -1 (Δ = 1) but Δ decodes as 0.9.
  ASSERT_OK(steps.AddOwn(10, std::vector<float>{0.9f}));
  ASSERT_OK(steps.AddPeer(10, 0, std::vector<float>{0.9f}, 10));
  std::optional<OuterSteps::Step> step = steps.CloseReady();
  ASSERT_TRUE(step);
  // new anchor = -0.5 × (0.9 + 0.81) = -0.855; base = 0 - 0.9 = -0.9. A
  // model now at -1.2 (-0.2 committed since) becomes -1.2 + 0.045 =
  // -1.155 = anchor + (-0.1 lost by the coding) + (-0.2 committed).
  const float model = -1.2f + step->correction[0];
  EXPECT_NEAR(model, -0.855f - 0.1f - 0.2f, 1e-6);
}

TEST(OuterStepsTest, RefusesWhatNoHonestPeerSends) {
  OuterSteps steps = Make(Options(2), 3);
  steps.Start(std::vector<float>(3, 0.0f));
  const std::vector<float> delta(3, 0.1f);
  EXPECT_FALSE(steps.AddPeer(7, 0, delta, 5).ok());   // no round at 7
  EXPECT_FALSE(steps.AddPeer(30, 0, delta, 5).ok());  // > 2 periods ahead
  EXPECT_FALSE(steps.AddPeer(10, 2, delta, 5).ok());  // no such peer
  EXPECT_FALSE(steps.AddPeer(10, 0, std::vector<float>(2), 5).ok());  // size
  ASSERT_OK(steps.AddPeer(10, 0, delta, 5));   // within a period
  EXPECT_FALSE(steps.AddPeer(10, 0, delta, 5).ok());  // the same peer again
  ASSERT_OK(steps.AddPeer(10, 1, delta, 5));
  EXPECT_FALSE(steps.CloseReady());  // this site's Δ is missing
  ASSERT_OK(steps.AddOwn(10, delta));
  EXPECT_FALSE(steps.AddOwn(10, delta).ok());
  ASSERT_TRUE(steps.CloseReady());
  EXPECT_FALSE(steps.AddPeer(10, 0, delta, 12).ok());  // closed
  EXPECT_EQ(steps.rounds(), 0u);
}

TEST(OuterStepsTest, FragmentsAreStaggeredAndCoverTheModel) {
  OuterSteps steps = Make(Options(1, 12, 3), 10);
  EXPECT_EQ(steps.FragmentDueAt(4), 0u);
  EXPECT_EQ(steps.FragmentDueAt(8), 1u);
  EXPECT_EQ(steps.FragmentDueAt(12), 2u);
  EXPECT_EQ(steps.FragmentDueAt(16), 0u);
  EXPECT_FALSE(steps.FragmentDueAt(6));
  uint64_t covered = 0;
  for (uint32_t f = 0; f < 3; ++f) {
    const KeyRange range = steps.RangeOf(f);
    EXPECT_EQ(range.begin, covered);
    covered = range.end;
  }
  EXPECT_EQ(covered, 10u);
  steps.Start(std::vector<float>(10, 1.0f));
  const KeyRange second = steps.RangeOf(1);
  const std::vector<float> delta(second.end - second.begin, 0.5f);
  ASSERT_OK(steps.AddOwn(8, delta));
  ASSERT_OK(steps.AddPeer(8, 0, delta, 8));
  std::optional<OuterSteps::Step> step = steps.CloseReady();
  ASSERT_TRUE(step);
  EXPECT_EQ(step->range.begin, second.begin);
  for (uint64_t i = 0; i < 10; ++i) {
    const bool inside = i >= second.begin && i < second.end;
    EXPECT_EQ(steps.anchor()[i] != 1.0f, inside) << i;
  }
}

TEST(OuterStepsTest, CheckpointRoundTripKeepsOpenRounds) {
  OuterSteps steps = Make(Options(2), 4);
  steps.Start(std::vector<float>{1, 2, 3, 4});
  ASSERT_OK(steps.AddOwn(10, std::vector<float>{0.1f, 0, 0, 0}));
  ASSERT_OK(steps.AddPeer(10, 1, std::vector<float>{0.2f, 0, 0, 0}, 10));
  auto [meta, arrays] = Save(steps);

  OuterSteps restored = Make(Options(2), 4);
  ASSERT_OK(restored.RestoreFrom(meta, arrays));
  EXPECT_TRUE(restored.HasOwn(10));
  // Peer 1 already counted; peer 0 completes the round in both.
  EXPECT_FALSE(restored.AddPeer(10, 1, std::vector<float>(4), 10).ok());
  ASSERT_OK(restored.AddPeer(10, 0, std::vector<float>{0.3f, 0, 0, 0}, 10));
  ASSERT_OK(steps.AddPeer(10, 0, std::vector<float>{0.3f, 0, 0, 0}, 10));
  std::optional<OuterSteps::Step> a = steps.CloseReady();
  std::optional<OuterSteps::Step> b = restored.CloseReady();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->correction, b->correction);
  EXPECT_EQ(
      std::vector<float>(steps.anchor().begin(), steps.anchor().end()),
      std::vector<float>(restored.anchor().begin(), restored.anchor().end()));

  // A checkpoint without the arrays it names is refused, state unchanged.
  Checkpoint empty;
  OuterSteps fresh = Make(Options(2), 4);
  EXPECT_FALSE(fresh.RestoreFrom(meta, empty).ok());
  EXPECT_FALSE(fresh.started());
}

// ---- Error feedback (SparseLoCo) ----------------------------------------

OuterStepOptions SparseLoCoOptions(uint32_t peers, double decay) {
  OuterStepOptions options = Options(peers);
  options.lr = 0.7;
  options.momentum = 0;
  options.nesterov = false;
  options.error_feedback = true;
  options.feedback_decay = decay;
  return options;
}

pb::CompressionConfig SparseLoCoCoding() {
  pb::CompressionConfig config;
  config.set_selection(pb::TOP_K);
  config.set_top_k_fraction(0.02);
  config.set_value_coding(pb::VALUE_INT2);
  config.set_block_size(64);
  config.set_rounding(pb::ROUND_STOCHASTIC);
  return config;
}

std::vector<float> AsVector(std::span<const float> values) {
  return std::vector<float>(values.begin(), values.end());
}

float MaxAbs(const std::vector<float>& values) {
  float max = 0;
  for (float v : values) max = std::max(max, std::abs(v));
  return max;
}

TEST(OuterStepsTest, ErrorFeedbackRefusesADecayOutsideTheUnitInterval) {
  EXPECT_FALSE(OuterSteps::Create(SparseLoCoOptions(1, 1.5), 8).ok());
  EXPECT_FALSE(OuterSteps::Create(SparseLoCoOptions(1, -0.1), 8).ok());
  EXPECT_OK(OuterSteps::Create(SparseLoCoOptions(1, 0), 8));
  EXPECT_OK(OuterSteps::Create(SparseLoCoOptions(1, 1), 8));
}

// Three sites, three rounds of top-2% int2 messages with error feedback
// (β = 0.9), as the outer rounds run them: each site's message is β·e + Δ,
// e keeps what the message did not carry (e + sent = β·e_old + Δ, up to
// float rounding), and after every round the three replicas are the same
// model, the new anchor, identical at every site: the unsent part waits
// in the residuals, not in the replicas.
TEST(OuterStepsTest, ErrorFeedbackKeepsReplicasIdenticalAndCarriesTheRest) {
  constexpr size_t kSites = 3;
  constexpr size_t kElements = 3000;
  constexpr float kDecay = 0.9f;
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> initial(kElements);
  for (float& v : initial) v = normal(random);
  std::vector<OuterSteps> sites;
  std::vector<std::vector<float>> models(kSites, initial);
  for (size_t s = 0; s < kSites; ++s) {
    sites.push_back(Make(SparseLoCoOptions(kSites - 1, kDecay), kElements));
    sites[s].Start(initial);
  }
  Result<UpdateEncoder> encoder = UpdateEncoder::Create(SparseLoCoCoding());
  ASSERT_OK(encoder);
  UpdateDecoder decoder;
  for (int64_t clock : {10, 20, 30}) {
    const std::vector<float> anchor_before = AsVector(sites[0].anchor());
    std::vector<std::vector<float>> sent(kSites);
    for (size_t s = 0; s < kSites; ++s) {
      // The workers' progress this round: different at every site.
      for (float& v : models[s]) v += 0.01f * normal(random);
      std::vector<float> delta;
      sites[s].OuterGradient(0, models[s], &delta);
      const std::vector<float> old_residual = AsVector(sites[s].residual());
      std::vector<float> message = delta;
      sites[s].AddResidual(0, &message);
      Result<EncodedUpdate> encoded = encoder->EncodeDense(message, {});
      ASSERT_OK(encoded);
      EXPECT_EQ(encoded->summary.sent, kElements / 50);  // 2%
      sent[s].resize(kElements);
      ASSERT_OK(decoder.DecodeDense(encoded->bytes, sent[s]));
      ASSERT_OK(sites[s].AddOwn(clock, sent[s], models[s]));
      sites[s].KeepResidual(0, message, sent[s]);
      const float tolerance = 1e-6f * MaxAbs(message);
      size_t carried = 0;
      for (size_t i = 0; i < kElements; ++i) {
        carried += sent[s][i] != 0.0f;
        ASSERT_NEAR(sites[s].residual()[i] + sent[s][i],
                    kDecay * old_residual[i] + delta[i], tolerance)
            << "site " << s << " element " << i << " round " << clock;
      }
      EXPECT_EQ(carried, kElements / 50);
    }
    // Every site adds the three messages in the same order (so the sums,
    // and the anchors, are bit for bit the same).
    for (size_t s = 0; s < kSites; ++s) {
      for (size_t from = 0; from < kSites; ++from) {
        if (from == s) continue;
        const uint32_t position = from < s ? from : from - 1;
        ASSERT_OK(sites[s].AddPeer(clock, position, sent[from], clock));
      }
      std::optional<OuterSteps::Step> step = sites[s].CloseReady();
      ASSERT_TRUE(step) << s;
      for (size_t i = 0; i < kElements; ++i) {
        models[s][i] += step->correction[i];
      }
    }
    for (size_t s = 1; s < kSites; ++s) {
      EXPECT_EQ(AsVector(sites[s].anchor()), AsVector(sites[0].anchor()));
    }
    // The anchor took plain SGD on the mean message (no momentum).
    for (size_t i = 0; i < kElements; ++i) {
      const float mean = (sent[0][i] + sent[1][i] + sent[2][i]) / 3;
      ASSERT_NEAR(sites[0].anchor()[i], anchor_before[i] - 0.7f * mean, 1e-5f)
          << i;
      for (size_t s = 0; s < kSites; ++s) {
        ASSERT_NEAR(models[s][i], sites[0].anchor()[i],
                    1e-6f * (1 + std::abs(sites[0].anchor()[i])))
            << "site " << s << " element " << i << " round " << clock;
      }
    }
  }
  // The residuals hold what was not sent: most of each Δ.
  for (size_t s = 0; s < kSites; ++s) {
    EXPECT_GT(MaxAbs(AsVector(sites[s].residual())), 0.0f);
  }
}

// The residual is saved with the anchor and restored; a checkpoint of a
// job without error feedback restores a zero one; one naming a residual
// it does not hold is refused.
TEST(OuterStepsTest, ErrorFeedbackResidualSurvivesTheCheckpoint) {
  OuterSteps steps = Make(SparseLoCoOptions(1, 1.0), 4);
  steps.Start(std::vector<float>{1, 2, 3, 4});
  std::vector<float> message;
  steps.OuterGradient(0, std::vector<float>{0.5f, 2, 3, 3}, &message);
  steps.AddResidual(0, &message);
  const std::vector<float> sent = {0.5f, 0, 0, 0};
  ASSERT_OK(steps.AddOwn(10, sent, std::vector<float>{0.5f, 2, 3, 3}));
  steps.KeepResidual(0, message, sent);
  EXPECT_EQ(AsVector(steps.residual()), (std::vector<float>{0, 0, 0, 1}));
  auto [meta, arrays] = Save(steps);
  EXPECT_TRUE(meta.has_residual());
  ASSERT_NE(arrays.Find("outer/residual"), nullptr);

  OuterSteps restored = Make(SparseLoCoOptions(1, 1.0), 4);
  ASSERT_OK(restored.RestoreFrom(meta, arrays));
  EXPECT_EQ(AsVector(restored.residual()), AsVector(steps.residual()));
  EXPECT_TRUE(restored.HasOwn(10));

  // Without error feedback before: a zero residual.
  OuterSteps plain = Make(Options(1), 4);
  plain.Start(std::vector<float>{1, 2, 3, 4});
  auto [plain_meta, plain_arrays] = Save(plain);
  EXPECT_FALSE(plain_meta.has_residual());
  OuterSteps turned_on = Make(SparseLoCoOptions(1, 1.0), 4);
  ASSERT_OK(turned_on.RestoreFrom(plain_meta, plain_arrays));
  EXPECT_EQ(AsVector(turned_on.residual()), std::vector<float>(4, 0.0f));

  // A residual named but missing: refused, nothing changed.
  Checkpoint partial;
  for (const NamedArray& array : arrays.arrays) {
    if (array.name != "outer/residual") partial.arrays.push_back(array);
  }
  OuterSteps fresh = Make(SparseLoCoOptions(1, 1.0), 4);
  EXPECT_FALSE(fresh.RestoreFrom(meta, partial).ok());
  EXPECT_FALSE(fresh.started());
}

// ---- Adaptive period ---------------------------------------------------

OuterStepOptions AdaptiveOptions(uint32_t peers, uint32_t period = 10) {
  OuterStepOptions options = Options(peers, period);
  options.lr = 1;
  options.momentum = 0;
  options.nesterov = false;
  options.adaptive = true;
  options.min_period = 2;
  options.max_period = 40;
  return options;
}

TEST(OuterStepsTest, AdaptivePeriodNeedsOneFragmentAndAPeriodInBounds) {
  OuterStepOptions options = AdaptiveOptions(1);
  EXPECT_OK(OuterSteps::Create(options, 8));
  options.fragments = 2;
  EXPECT_FALSE(OuterSteps::Create(options, 8).ok());
  options = AdaptiveOptions(1, /*period=*/50);  // > max_period
  EXPECT_FALSE(OuterSteps::Create(options, 8).ok());
  options = AdaptiveOptions(1, /*period=*/1);  // < min_period
  EXPECT_FALSE(OuterSteps::Create(options, 8).ok());

  pb::SyncConfig sync;
  sync.set_kind(pb::MODEL_AVERAGING);
  sync.set_averaging_period(20);
  sync.mutable_skewscout()->set_enabled(true);
  sync.mutable_skewscout()->set_min_averaging_period(5);
  sync.mutable_skewscout()->set_max_averaging_period(80);
  const OuterStepOptions from = OuterStepOptionsFrom(sync, 2);
  EXPECT_TRUE(from.adaptive);
  EXPECT_EQ(from.min_period, 5u);
  EXPECT_EQ(from.max_period, 80u);
  sync.mutable_skewscout()->set_enabled(false);
  EXPECT_FALSE(OuterStepOptionsFrom(sync, 2).adaptive);
}

// Three sites, each its own OuterSteps, exchange their Δ with a proposed
// period per round: each round's shortest proposal becomes every site's
// period, so all compute the same next round's clock and the same anchor,
// and each records the same changes.
TEST(OuterStepsTest, AdaptivePeriodIsEverySiteTheShortestProposal) {
  constexpr int kSites = 3;
  std::vector<OuterSteps> sites;
  for (int i = 0; i < kSites; ++i) {
    sites.push_back(Make(AdaptiveOptions(kSites - 1), 2));
    sites.back().Start(std::vector<float>{0, 0});
  }
  // Peer position of site j at site i: the others in order.
  auto position = [](int i, int j) {
    return static_cast<uint32_t>(j < i ? j : j - 1);
  };
  auto round = [&](int64_t clock,
                   const std::array<uint32_t, kSites>& proposal) {
    for (int i = 0; i < kSites; ++i) {
      ASSERT_EQ(sites[i].NextRoundClock(), clock) << i;
      ASSERT_TRUE(sites[i].FragmentDueAt(clock));
      const std::vector<float> delta{static_cast<float>(i + 1), 0};
      ASSERT_OK(sites[i].AddOwn(clock, delta, {}, proposal[i]));
      for (int j = 0; j < kSites; ++j) {
        if (j == i) continue;
        ASSERT_OK(sites[j]
                .AddPeer(clock, position(j, i), delta, clock, proposal[i]))
            << j << " from " << i;
      }
    }
    for (int i = 0; i < kSites; ++i) ASSERT_TRUE(sites[i].CloseReady()) << i;
  };
  ASSERT_NO_FATAL_FAILURE(round(10, {10, 4, 7}));
  ASSERT_NO_FATAL_FAILURE(round(14, {8, 12, 9}));
  ASSERT_NO_FATAL_FAILURE(round(22, {8, 30, 9}));  // unchanged: 8
  for (const OuterSteps& site : sites) {
    EXPECT_EQ(site.period(), 8u);
    EXPECT_EQ(site.NextRoundClock(), 30);
    ASSERT_EQ(site.period_changes().size(), 2u);
    EXPECT_EQ(site.period_changes()[0].round, 10);
    EXPECT_EQ(site.period_changes()[0].period, 4u);
    EXPECT_EQ(site.period_changes()[1].round, 14);
    EXPECT_EQ(site.period_changes()[1].period, 8u);
    EXPECT_EQ(site.anchor()[0], sites[0].anchor()[0]);
    EXPECT_EQ(site.rounds_dropped(), 0u);
  }
  // Every round's anchor is the mean of -Δ: -(1 + 2 + 3) / 3 per round.
  EXPECT_FLOAT_EQ(sites[0].anchor()[0], -6.0f);
}

TEST(OuterStepsTest, AdaptivePeriodRefusesWhatNoHonestPeerSends) {
  OuterSteps steps = Make(AdaptiveOptions(2), 2);
  steps.Start(std::vector<float>{0, 0});
  const std::vector<float> delta{0.5f, 0};
  EXPECT_FALSE(steps.AddPeer(12, 0, delta, 5, 10).ok());  // not the next
  EXPECT_FALSE(steps.AddPeer(10, 0, delta, 5, 0).ok());   // no proposal
  EXPECT_FALSE(steps.AddPeer(10, 0, delta, 5, 41).ok());  // > max_period
  EXPECT_FALSE(steps.AddPeer(10, 0, delta, 5, 1).ok());   // < min_period
  EXPECT_FALSE(steps.AddOwn(10, delta, {}, 0).ok());
  EXPECT_EQ(steps.rounds(), 0u);
  ASSERT_OK(steps.AddPeer(10, 0, delta, 5, 6));
  ASSERT_OK(steps.AddOwn(10, delta, {}, 5));
  // This site's Δ is out: peer 0, which may have closed round 10 already,
  // sends the next round's, at a clock this site cannot check yet; one such
  // round per peer, within max_period.
  ASSERT_OK(steps.AddPeer(15, 0, delta, 10, 20));
  EXPECT_FALSE(steps.AddPeer(16, 0, delta, 10, 20).ok());  // a second one
  EXPECT_FALSE(steps.AddPeer(51, 1, delta, 10, 20).ok());  // > 40 ahead
  // Peer 1 claims round 17 ahead (it computed another period).
  ASSERT_OK(steps.AddPeer(17, 1, delta, 10, 20));
  EXPECT_FALSE(steps.CloseReady());  // round 10 lacks peer 1
  ASSERT_OK(steps.AddPeer(10, 1, delta, 10, 7));
  ASSERT_TRUE(steps.CloseReady());
  // Agreed min(6, 5, 7) = 5: round 15 is next; round 17 waits for it.
  EXPECT_EQ(steps.period(), 5u);
  EXPECT_EQ(steps.NextRoundClock(), 15);
  EXPECT_EQ(steps.rounds(), 2u);
  EXPECT_FALSE(steps.AddPeer(10, 1, delta, 15, 7).ok());  // closed
  EXPECT_FALSE(steps.AddOwn(12, delta, {}, 9).ok());      // before the next
  ASSERT_OK(steps.AddOwn(15, delta, {}, 9));
  // Peer 1 has a round ahead (17) already: not a second one.
  EXPECT_FALSE(steps.AddPeer(19, 1, delta, 15, 9).ok());
  ASSERT_OK(steps.AddPeer(15, 1, delta, 15, 9));
  ASSERT_TRUE(steps.CloseReady());
  // min(9, 20, 9) = 9: the schedule passes 17 without a round there.
  EXPECT_EQ(steps.period(), 9u);
  EXPECT_EQ(steps.NextRoundClock(), 24);
  EXPECT_EQ(steps.rounds(), 0u);
  EXPECT_EQ(steps.rounds_dropped(), 1u);
  // The count survives a restart: report.json's total stays the run's.
  auto [meta, arrays] = Save(steps);
  OuterSteps restored = Make(AdaptiveOptions(2), 2);
  ASSERT_OK(restored.RestoreFrom(meta, arrays));
  EXPECT_EQ(restored.rounds_dropped(), 1u);
}

// A restarted site replays its own rounds sent after its checkpoint: they
// may lie several rounds ahead, and close in order as the peer's Δ of
// each (resent with the same proposals) arrives.
TEST(OuterStepsTest, AdaptivePeriodReplaysOwnRoundsAhead) {
  OuterSteps steps = Make(AdaptiveOptions(1), 2);
  steps.Start(std::vector<float>{0, 0});
  const std::vector<float> delta{0.5f, 0};
  ASSERT_OK(steps.AddOwn(10, delta, {}, 4));
  ASSERT_OK(steps.AddOwn(14, delta, {}, 6));
  ASSERT_OK(steps.AddOwn(20, delta, {}, 6));
  // A checkpoint taken in the middle of the replay restores too.
  auto [meta, arrays] = Save(steps);
  OuterSteps restored = Make(AdaptiveOptions(1), 2);
  ASSERT_OK(restored.RestoreFrom(meta, arrays));
  for (OuterSteps* site : {&steps, &restored}) {
    ASSERT_OK(site->AddPeer(10, 0, delta, 20, 5));
    ASSERT_TRUE(site->CloseReady());
    EXPECT_EQ(site->NextRoundClock(), 14);
    ASSERT_OK(site->AddPeer(14, 0, delta, 20, 8));
    ASSERT_TRUE(site->CloseReady());
    EXPECT_EQ(site->NextRoundClock(), 20);
    ASSERT_OK(site->AddPeer(20, 0, delta, 20, 6));
    ASSERT_TRUE(site->CloseReady());
    EXPECT_EQ(site->NextRoundClock(), 26);
    EXPECT_EQ(site->rounds_dropped(), 0u);
    EXPECT_EQ(site->steps(), 3u);
  }
}

TEST(OuterStepsTest, AdaptivePeriodSurvivesTheCheckpoint) {
  OuterSteps steps = Make(AdaptiveOptions(1), 2);
  steps.Start(std::vector<float>{1, 2});
  ASSERT_OK(steps.AddOwn(10, std::vector<float>{0.1f, 0}, {}, 4));
  ASSERT_OK(steps.AddPeer(10, 0, std::vector<float>{0.2f, 0}, 10, 6));
  ASSERT_TRUE(steps.CloseReady());
  ASSERT_EQ(steps.NextRoundClock(), 14);
  // Round 14: the peer's Δ with its proposal is in, this site's is not.
  ASSERT_OK(steps.AddPeer(14, 0, std::vector<float>{0.3f, 0}, 12, 3));
  auto [meta, arrays] = Save(steps);
  EXPECT_EQ(meta.period(), 4u);
  ASSERT_EQ(meta.period_changes_size(), 1);

  OuterSteps restored = Make(AdaptiveOptions(1), 2);
  ASSERT_OK(restored.RestoreFrom(meta, arrays));
  EXPECT_EQ(restored.period(), 4u);
  EXPECT_EQ(restored.NextRoundClock(), 14);
  ASSERT_EQ(restored.period_changes().size(), 1u);
  EXPECT_EQ(restored.period_changes()[0].period, 4u);
  for (OuterSteps* site : {&steps, &restored}) {
    ASSERT_OK(site->AddOwn(14, std::vector<float>{0, 0}, {}, 12));
    ASSERT_TRUE(site->CloseReady());
    EXPECT_EQ(site->period(), 3u);  // the peer's restored proposal
    EXPECT_EQ(site->NextRoundClock(), 17);
  }

  // A period outside the bounds, or a round without its proposals, is
  // refused and changes nothing.
  pb::OuterStepCheckpoint bad = meta;
  bad.set_period(41);
  OuterSteps fresh = Make(AdaptiveOptions(1), 2);
  EXPECT_FALSE(fresh.RestoreFrom(bad, arrays).ok());
  bad = meta;
  bad.mutable_rounds(0)->clear_peer_proposals();
  EXPECT_FALSE(fresh.RestoreFrom(bad, arrays).ok());
  EXPECT_FALSE(fresh.started());
  EXPECT_EQ(fresh.period(), 10u);
}

}  // namespace
}  // namespace meridian
