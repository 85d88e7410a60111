// SkewScout's communication control on a scripted sequence of estimates
// (virtual time: the controller sees only the numbers it is given).

#include "meridian/sync/skew_control.h"
#include "testing/status_matchers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace meridian {
namespace {

SkewControlOptions ThetaOptions() {
  SkewControlOptions options;
  options.target_loss = 0.01;
  options.dead_band = 0.25;
  options.smoothing = 1.0;  // each estimate counts alone unless a test says
  options.tighten_factor = 2.0;
  options.loosen_factor = 1.25;
  options.patience = 2;
  options.min_knob = 0.005;
  options.max_knob = 0.5;
  options.larger_is_looser = true;
  options.significance_z = 2.0;
  options.min_period = 100;
  options.max_period = 800;
  return options;
}

TravelScores Scores(uint32_t samples, double own, double travelled,
                    uint32_t discordant) {
  TravelScores scores;
  scores.samples = samples;
  scores.own_accuracy = own;
  scores.travelled_accuracy = travelled;
  scores.discordant = discordant;
  return scores;
}

SkewController Make(const SkewControlOptions& options, double knob) {
  Result<SkewController> controller = SkewController::Create(options, knob);
  EXPECT_OK(controller);
  return std::move(*controller);
}

TEST(SkewControllerTest, TightensOnAHighEstimateDownToItsBound) {
  SkewController controller = Make(ThetaOptions(), 0.08);
  // The peer's own model scores 0.85, this site's travelled one 0.80: a
  // five-point loss against a one-point target.
  const SkewDecision& first =
      controller.Observe(10, 100, "eu", 500, 0.85, 0.80);
  EXPECT_EQ(first.action, SkewAction::kTighten);
  EXPECT_NEAR(first.estimate, 0.05, 1e-12);
  EXPECT_DOUBLE_EQ(first.knob_before, 0.08);
  EXPECT_DOUBLE_EQ(first.knob_after, 0.04);
  EXPECT_DOUBLE_EQ(controller.knob(), 0.04);
  for (int i = 0; i < 10; ++i)
    controller.Observe(20 + i, 200, "eu", 500, 0.85, 0.80);
  EXPECT_DOUBLE_EQ(controller.knob(), 0.005);  // the bound, never below
  // At the bound a high estimate holds (nothing left to tighten).
  EXPECT_EQ(controller.decisions().back().action, SkewAction::kHold);
  EXPECT_EQ(controller.tightened(), 4u);  // 0.04 .. 0.01, then clamped once
}

TEST(SkewControllerTest, LoosensOnlyAfterPatienceAndUpToItsBound) {
  SkewController controller = Make(ThetaOptions(), 0.1);
  // No loss: the first low estimate waits, the second loosens.
  EXPECT_EQ(controller.Observe(1, 10, "ap", 400, 0.9, 0.9).action,
            SkewAction::kHold);
  EXPECT_DOUBLE_EQ(controller.knob(), 0.1);
  EXPECT_EQ(controller.Observe(2, 20, "ap", 400, 0.9, 0.9).action,
            SkewAction::kLoosen);
  EXPECT_DOUBLE_EQ(controller.knob(), 0.125);
  for (int i = 0; i < 40; ++i)
    controller.Observe(3 + i, 30, "ap", 400, 0.9, 0.9);
  EXPECT_DOUBLE_EQ(controller.knob(), 0.5);
  // 0.1 -> 0.125 -> ... -> 0.477 in ×1.25 steps, then clamped to 0.5.
  EXPECT_EQ(controller.loosened(), 8u);
}

TEST(SkewControllerTest, HoldsInsideTheDeadBandAndAHighEstimateResetsPatience) {
  SkewController controller = Make(ThetaOptions(), 0.1);
  // Within target × (1 ± 0.25): hold.
  EXPECT_EQ(controller.Observe(1, 1, "eu", 500, 0.9, 0.89).action,
            SkewAction::kHold);
  EXPECT_EQ(controller.Observe(2, 2, "eu", 500, 0.9, 0.888).action,
            SkewAction::kHold);
  // Low, then in the band, then low: the band in between resets patience.
  controller.Observe(3, 3, "eu", 500, 0.9, 0.9);
  controller.Observe(4, 4, "eu", 500, 0.9, 0.89);
  EXPECT_EQ(controller.Observe(5, 5, "eu", 500, 0.9, 0.9).action,
            SkewAction::kHold);
  EXPECT_DOUBLE_EQ(controller.knob(), 0.1);
}

TEST(SkewControllerTest, SmoothingKeepsOneNoisyEstimateFromMovingTheKnob) {
  SkewControlOptions options = ThetaOptions();
  options.smoothing = 0.25;
  SkewController controller = Make(options, 0.1);
  controller.Observe(1, 1, "eu", 300, 0.9, 0.9);  // smoothed 0
  // One estimate of 3 points: smoothed 0.0075, inside the band.
  const SkewDecision& spike = controller.Observe(2, 2, "eu", 300, 0.9, 0.87);
  EXPECT_NEAR(spike.smoothed, 0.0075, 1e-12);
  EXPECT_EQ(spike.action, SkewAction::kHold);
  // A loss that persists moves it.
  controller.Observe(3, 3, "eu", 300, 0.9, 0.87);
  EXPECT_EQ(controller.Observe(4, 4, "eu", 300, 0.9, 0.87).action,
            SkewAction::kTighten);
}

TEST(SkewControllerTest, ADensityKnobTightensUpwards) {
  SkewControlOptions options = ThetaOptions();
  options.larger_is_looser = false;  // top-k density
  options.min_knob = 0.001;
  options.max_knob = 0.25;
  SkewController controller = Make(options, 0.01);
  controller.Observe(1, 1, "eu", 500, 0.9, 0.8);
  EXPECT_DOUBLE_EQ(controller.knob(), 0.02);
  controller.Observe(2, 2, "eu", 500, 0.9, 0.9);
  controller.Observe(3, 3, "eu", 500, 0.9, 0.9);
  EXPECT_DOUBLE_EQ(controller.knob(), 0.016);
}

TEST(SkewControllerTest, UnusableResultsAreRecordedButIgnored) {
  SkewController controller = Make(ThetaOptions(), 0.1);
  for (auto [samples, own, travelled] :
       {std::tuple<uint32_t, double, double>{0, 0.9, 0.5},
        {500, 1.5, 0.5},
        {500, 0.9, -0.1},
        {500, std::nan(""), 0.5}}) {
    const SkewDecision& d =
        controller.Observe(1, 1, "eu", samples, own, travelled);
    EXPECT_EQ(d.action, SkewAction::kHold);
  }
  EXPECT_FALSE(controller.has_estimate());
  EXPECT_DOUBLE_EQ(controller.knob(), 0.1);
  EXPECT_EQ(controller.decisions().size(), 4u);
}

TEST(SkewControllerTest, DecisionsAreBounded) {
  SkewController controller = Make(ThetaOptions(), 0.1);
  for (size_t i = 0; i < SkewController::kMaxDecisions + 500; ++i) {
    controller.Observe(static_cast<double>(i), static_cast<int64_t>(i), "eu",
                       100, 0.9, 0.9);
  }
  EXPECT_EQ(controller.decisions().size(), SkewController::kMaxDecisions);
  EXPECT_EQ(controller.decisions().front().clock, 500);
}

TEST(TravelScoresTest, StandardErrorIsThePairedProportionsOne) {
  // 2000 samples, 80 where exactly one model is right, a 1-point gap:
  // sqrt((0.04 - 0.0001) / 2000).
  EXPECT_NEAR(Scores(2000, 0.86, 0.85, 80).StandardError(),
              std::sqrt((0.04 - 0.0001) / 2000), 1e-15);
  EXPECT_DOUBLE_EQ(Scores(2000, 0.86, 0.86, 0).StandardError(), 0);
  EXPECT_DOUBLE_EQ(Scores(0, 0.86, 0.85, 0).StandardError(), 0);
}

TEST(SkewControllerTest, AGapWithinTheNoiseDoesNotMoveTheKnob) {
  // A 3-point gap on 300 samples where the models disagree on 60 (SE
  // 2.5 points): not distinguishable from the 1-point target at z = 2.
  SkewController noisy = Make(ThetaOptions(), 0.1);
  const SkewDecision& held =
      noisy.Observe(1, 1, "eu", Scores(300, 0.90, 0.87, 60));
  EXPECT_EQ(held.action, SkewAction::kHold);
  EXPECT_NEAR(held.standard_error, std::sqrt((0.2 - 0.0009) / 300), 1e-12);
  // The same gap on 3000 samples with 300 disagreements (SE 0.8 points):
  // significant, tightens.
  SkewController sharp = Make(ThetaOptions(), 0.1);
  EXPECT_EQ(sharp.Observe(1, 1, "eu", Scores(3000, 0.90, 0.87, 300)).action,
            SkewAction::kTighten);
  // z = 0: the dead band alone decides, as without a discordant count.
  SkewControlOptions band_only = ThetaOptions();
  band_only.significance_z = 0;
  SkewController plain = Make(band_only, 0.1);
  EXPECT_EQ(plain.Observe(1, 1, "eu", Scores(300, 0.90, 0.87, 60)).action,
            SkewAction::kTighten);
}

TEST(SkewControllerTest, SmoothingShrinksTheNoiseItAllows) {
  SkewControlOptions options = ThetaOptions();
  options.smoothing = 0.5;
  SkewController controller = Make(options, 0.1);
  // Each estimate alone (SE ~1.3 points) is within the noise of the
  // target; their running mean becomes significant.
  const TravelScores gap = Scores(1000, 0.90, 0.865, 170);
  EXPECT_EQ(controller.Observe(1, 1, "eu", gap).action, SkewAction::kHold);
  const double first_se = controller.decisions().back().standard_error;
  controller.Observe(2, 2, "eu", gap);
  EXPECT_LT(controller.decisions().back().standard_error, first_se);
  SkewAction last = SkewAction::kHold;
  for (int i = 3; i < 8 && last == SkewAction::kHold; ++i) {
    last = controller.Observe(i, i, "eu", gap).action;
  }
  EXPECT_EQ(last, SkewAction::kTighten);
}

TEST(SkewControllerTest, TravelsLessWhileTheLossStaysLow) {
  SkewController controller = Make(ThetaOptions(), 0.1);
  EXPECT_EQ(controller.travel_period(), 100u);
  // No loss: the period doubles per estimate up to its bound.
  for (uint32_t expected : {200u, 400u, 800u, 800u}) {
    EXPECT_EQ(controller.Observe(1, 1, "eu", Scores(2000, 0.9, 0.9, 20))
                  .travel_period,
              expected);
  }
  // In the band: unchanged.
  controller.Observe(2, 2, "eu", Scores(2000, 0.9, 0.89, 20));
  EXPECT_EQ(controller.travel_period(), 800u);
  // A high loss: back to the shortest period while it tightens.
  controller.Observe(3, 3, "eu", Scores(2000, 0.9, 0.85, 100));
  EXPECT_EQ(controller.decisions().back().action, SkewAction::kTighten);
  EXPECT_EQ(controller.travel_period(), 100u);
}

TEST(SkewControllerTest, ADiscordantCountAboveTheSamplesIsUnusable) {
  SkewController controller = Make(ThetaOptions(), 0.1);
  EXPECT_EQ(controller.Observe(1, 1, "eu", Scores(100, 0.9, 0.5, 101)).action,
            SkewAction::kHold);
  EXPECT_FALSE(controller.has_estimate());
}

TEST(SkewControllerTest, ARestartContinuesFromTheSavedState) {
  SkewController before = Make(ThetaOptions(), 0.1);
  before.Observe(1, 1, "eu", Scores(2000, 0.9, 0.85, 100));  // tightens
  before.Observe(2, 2, "eu", Scores(2000, 0.9, 0.9, 20));
  const SkewController::State saved = before.Save();
  SkewController after = Make(ThetaOptions(), 0.1);  // sync.threshold again
  after.Restore(saved);
  EXPECT_DOUBLE_EQ(after.knob(), before.knob());
  EXPECT_EQ(after.travel_period(), before.travel_period());
  EXPECT_DOUBLE_EQ(after.smoothed_loss(), before.smoothed_loss());
  EXPECT_EQ(after.tightened(), 1u);
  ASSERT_EQ(after.decisions().size(), 2u);
  // The next estimate is decided as it would have been without the
  // restart: one more low estimate completes the patience and loosens.
  const SkewDecision& next_before =
      before.Observe(3, 3, "eu", Scores(2000, 0.9, 0.9, 20));
  const SkewDecision& next_after =
      after.Observe(3, 3, "eu", Scores(2000, 0.9, 0.9, 20));
  EXPECT_EQ(next_after.action, next_before.action);
  EXPECT_DOUBLE_EQ(next_after.knob_after, next_before.knob_after);
}

TEST(SkewControllerTest, ARestoredStateIsBoundedByTheOptions) {
  SkewController::State hostile;
  hostile.knob = 7.0;         // above max_knob
  hostile.travel_period = 1;  // below min_period
  hostile.smoothed = std::nan("");
  hostile.smoothed_variance = -1;
  hostile.low_in_a_row = 1000;
  hostile.decisions.resize(SkewController::kMaxDecisions + 10);
  SkewController controller = Make(ThetaOptions(), 0.1);
  controller.Restore(std::move(hostile));
  EXPECT_DOUBLE_EQ(controller.knob(), 0.5);
  EXPECT_EQ(controller.travel_period(), 100u);
  EXPECT_FALSE(controller.has_estimate());
  EXPECT_EQ(controller.decisions().size(), SkewController::kMaxDecisions);
  // A low estimate after the restore needs at most `patience` to loosen
  // (the saved run was clamped), and θ stays within its bounds.
  controller.Observe(1, 1, "eu", Scores(2000, 0.9, 0.9, 20));
  EXPECT_LE(controller.knob(), 0.5);
}

TEST(SkewControllerTest, AJobsOptionsControlTheThreshold) {
  pb::SkewScoutConfig config;
  config.set_target_loss(0.02);
  config.set_min_theta(0.01);
  config.set_max_theta(0.3);
  config.set_patience(3);
  const SkewControlOptions options = SkewControlOptionsFrom(config);
  EXPECT_DOUBLE_EQ(options.target_loss, 0.02);
  EXPECT_DOUBLE_EQ(options.min_knob, 0.01);
  EXPECT_DOUBLE_EQ(options.max_knob, 0.3);
  EXPECT_EQ(options.patience, 3u);
  EXPECT_TRUE(options.larger_is_looser);
  EXPECT_EQ(options.min_period, 200u);   // the proto's default
  EXPECT_EQ(options.max_period, 1600u);  // 8 × travel_period when unset
  config.set_travel_period(50);
  config.set_max_travel_period(120);
  EXPECT_EQ(SkewControlOptionsFrom(config).max_period, 120u);
  // The proto's defaults are valid options.
  EXPECT_OK(SkewController::Create(
                  SkewControlOptionsFrom(pb::SkewScoutConfig()), 0.05));
}

TEST(SkewControllerTest, TopKSyncMakesTheDensityTheKnob) {
  pb::SyncConfig sync;
  sync.set_kind(pb::GAIA);
  sync.set_threshold(0);
  sync.mutable_compression()->set_selection(pb::TOP_K);
  sync.mutable_compression()->set_top_k_fraction(0.01);
  ASSERT_EQ(SkewKnobOf(sync), SkewKnob::kTopKDensity);
  EXPECT_STREQ(SkewKnobName(SkewKnobOf(sync)), "top_k_fraction");
  const SkewControlOptions options = SkewControlOptionsFrom(sync);
  EXPECT_FALSE(options.larger_is_looser);
  EXPECT_DOUBLE_EQ(options.min_knob, 0.001);  // min_density
  EXPECT_DOUBLE_EQ(options.max_knob, 0.25);   // max_density
  EXPECT_DOUBLE_EQ(InitialKnob(sync), 0.01);
  SkewController controller = Make(options, InitialKnob(sync));
  controller.Observe(1, 1, "eu", Scores(2000, 0.9, 0.85, 100));
  EXPECT_DOUBLE_EQ(controller.knob(), 0.02);  // a high loss: denser
  // A threshold above 0, or no top-k selection: θ.
  sync.set_threshold(0.05);
  EXPECT_EQ(SkewKnobOf(sync), SkewKnob::kTheta);
  EXPECT_DOUBLE_EQ(InitialKnob(sync), 0.05);
  EXPECT_TRUE(SkewControlOptionsFrom(sync).larger_is_looser);
  sync.set_threshold(0);
  sync.mutable_compression()->set_selection(pb::SELECT_ALL);
  EXPECT_EQ(SkewKnobOf(sync), SkewKnob::kTheta);
}

// FedAvg (and DiLoCo): the averaging period is the knob; a high loss
// shortens it, and a site proposes it in whole clocks within its bounds.
TEST(SkewControllerTest, AveragingSyncMakesThePeriodTheKnob) {
  pb::SyncConfig sync;
  sync.set_kind(pb::MODEL_AVERAGING);
  sync.set_averaging_period(50);
  sync.mutable_skewscout()->set_min_averaging_period(4);
  sync.mutable_skewscout()->set_max_averaging_period(100);
  ASSERT_EQ(SkewKnobOf(sync), SkewKnob::kAveragingPeriod);
  EXPECT_STREQ(SkewKnobName(SkewKnobOf(sync)), "averaging_period");
  const SkewControlOptions options = SkewControlOptionsFrom(sync);
  EXPECT_TRUE(options.larger_is_looser);
  EXPECT_DOUBLE_EQ(options.min_knob, 4);
  EXPECT_DOUBLE_EQ(options.max_knob, 100);
  EXPECT_DOUBLE_EQ(InitialKnob(sync), 50);
  SkewController controller = Make(options, InitialKnob(sync));
  controller.Observe(1, 1, "eu", Scores(2000, 0.9, 0.85, 100));
  EXPECT_DOUBLE_EQ(controller.knob(), 25);  // a high loss: average sooner
  for (int i = 0; i < 10; ++i) {
    controller.Observe(2 + i, 2 + i, "eu", Scores(2000, 0.9, 0.8, 200));
  }
  EXPECT_DOUBLE_EQ(controller.knob(), 4);  // bounded
  const pb::SkewScoutConfig& config = sync.skewscout();
  EXPECT_EQ(ProposedPeriod(4, config), 4u);
  EXPECT_EQ(ProposedPeriod(12.5, config), 13u);
  EXPECT_EQ(ProposedPeriod(12.4, config), 12u);
  EXPECT_EQ(ProposedPeriod(1, config), 4u);
  EXPECT_EQ(ProposedPeriod(1e9, config), 100u);
  EXPECT_EQ(ProposedPeriod(std::nan(""), config), 100u);
  sync.set_kind(pb::DILOCO);
  EXPECT_EQ(SkewKnobOf(sync), SkewKnob::kAveragingPeriod);
}

TEST(SkewControllerTest, BadOptionsAreRefusedByName) {
  struct Case {
    void (*edit)(SkewControlOptions&);
    double knob;
    const char* names;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const Case cases[] = {
      {[](SkewControlOptions& o) { o.target_loss = 0; }, 0.1, "target_loss"},
      {[](SkewControlOptions& o) { o.dead_band = 1; }, 0.1, "dead_band"},
      {[](SkewControlOptions& o) { o.smoothing = 0; }, 0.1, "smoothing"},
      {[](SkewControlOptions& o) { o.tighten_factor = 1; }, 0.1,
       "tighten_factor"},
      {[](SkewControlOptions& o) { o.loosen_factor = 0.5; }, 0.1,
       "loosen_factor"},
      {[](SkewControlOptions& o) { o.patience = 0; }, 0.1, "patience"},
      {[](SkewControlOptions& o) { o.min_knob = 0; }, 0.1, "min_knob"},
      {[](SkewControlOptions& o) { o.min_knob = 0.6; }, 0.1, "min_knob"},
      {[](SkewControlOptions& o) { o.significance_z = -1; }, 0.1,
       "significance_z"},
      {[](SkewControlOptions& o) { o.min_period = 0; }, 0.1, "min_period"},
      {[](SkewControlOptions& o) { o.max_period = 50; }, 0.1, "min_period"},
      {[](SkewControlOptions&) {}, 0.7, "initial knob"},
      {[](SkewControlOptions&) {}, inf, "initial knob"},
  };
  for (const Case& c : cases) {
    SkewControlOptions options = ThetaOptions();
    c.edit(options);
    Result<SkewController> controller = SkewController::Create(options, c.knob);
    ASSERT_FALSE(controller.ok()) << c.names;
    EXPECT_NE(controller.status().message().find(c.names), std::string::npos)
        << controller.status();
  }
}

}  // namespace
}  // namespace meridian
