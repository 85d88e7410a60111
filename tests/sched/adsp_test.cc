#include "sched/adsp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "meridian/core/clock.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---------------------------------------------------------------------------
// Commit interval arithmetic.

TEST(AdspCommitIntervalTest, PeriodOverCommitsMinusOverhead) {
  // The authors' numbers: Gamma 60 s, T_min 10 s.
  EXPECT_DOUBLE_EQ(AdspCommitInterval(60, 2, 1.5, 10), 28.5);
  EXPECT_DOUBLE_EQ(AdspCommitInterval(60, 4, 0, 10), 15);
  // Gamma/dC - o below T_min: the floor wins.
  EXPECT_DOUBLE_EQ(AdspCommitInterval(60, 6, 1.5, 10), 10);
  EXPECT_DOUBLE_EQ(AdspCommitInterval(60, 60, 0, 10), 10);
  // Ours: 10 s, 10 commits, 0.2 s overhead.
  EXPECT_DOUBLE_EQ(AdspCommitInterval(10, 10, 0.2, 0.1), 0.8);
  EXPECT_DOUBLE_EQ(AdspCommitInterval(10, 10, 5, 0.1), 0.1);
}

TEST(AdspLinkFloorTest, KeepsTheRoundTripWithinItsFractionOfTheCycle) {
  // 0.25 s round trip, at most 10% of the cycle: 2.25 s + 0.25 s = 2.5 s.
  EXPECT_DOUBLE_EQ(AdspLinkFloor(0.25, 0.1, 10), 2.25);
  EXPECT_DOUBLE_EQ(AdspLinkFloor(0.25, 0.5, 10), 0.25);
  // A link slower than one commit per period allows: once per period.
  EXPECT_DOUBLE_EQ(AdspLinkFloor(2, 0.1, 10), 10);
  // Off, or nothing measured yet, or nonsense from the worker: no floor.
  EXPECT_EQ(AdspLinkFloor(0.25, 0, 10), 0);
  EXPECT_EQ(AdspLinkFloor(0.25, 1, 10), 0);
  EXPECT_EQ(AdspLinkFloor(0.25, kNaN, 10), 0);
  EXPECT_EQ(AdspLinkFloor(0, 0.1, 10), 0);
  EXPECT_EQ(AdspLinkFloor(-1, 0.1, 10), 0);
  EXPECT_EQ(AdspLinkFloor(kNaN, 0.1, 10), 0);
  EXPECT_EQ(AdspLinkFloor(kInf, 0.1, 10), 0);
  // A period that is not a number does not cap it.
  EXPECT_DOUBLE_EQ(AdspLinkFloor(2, 0.1, kNaN), 18);
}

TEST(AdspCommitIntervalTest, BadInputsNeverGiveNaNOrNegative) {
  EXPECT_DOUBLE_EQ(AdspCommitInterval(10, 0, 0, 0.1), 10);  // 0 counts as 1
  EXPECT_DOUBLE_EQ(AdspCommitInterval(10, 10, kNaN, 0.1), 1);
  EXPECT_DOUBLE_EQ(AdspCommitInterval(10, 10, -3, 0.1), 1);
  EXPECT_DOUBLE_EQ(AdspCommitInterval(10, 10, kInf, 0.1), 1);
  EXPECT_DOUBLE_EQ(AdspCommitInterval(kNaN, 10, 0, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(AdspCommitInterval(10, 10, 2, -1), 0);
  EXPECT_DOUBLE_EQ(AdspCommitInterval(10, 10, 0, kNaN), 1);
}

TEST(CommitOverheadEstimateTest, SmoothsOverSeveralCommits) {
  CommitOverheadEstimate estimate;
  EXPECT_EQ(estimate.value_s(), 0);
  estimate.Add(0.4);
  EXPECT_DOUBLE_EQ(estimate.value_s(), 0.4);  // the first sample is taken
  // One outlier moves it a quarter of the way, not all the way.
  estimate.Add(2.0);
  EXPECT_DOUBLE_EQ(estimate.value_s(), 0.8);
  estimate.Add(kNaN);  // ignored
  EXPECT_DOUBLE_EQ(estimate.value_s(), 0.8);
  EXPECT_EQ(estimate.samples(), 2u);
  estimate.Add(-1);  // counts as 0
  EXPECT_DOUBLE_EQ(estimate.value_s(), 0.6);
  for (int i = 0; i < 60; ++i) estimate.Add(0.3);
  EXPECT_NEAR(estimate.value_s(), 0.3, 1e-6);
}

// ---------------------------------------------------------------------------
// Loss curve fit and score.

std::vector<LossSample> Curve(double a2, double b, double c,
                              std::vector<double> times) {
  std::vector<LossSample> samples;
  for (double t : times) samples.push_back({t, 1.0 / (a2 * t + b) + c});
  return samples;
}

TEST(FitLossCurveTest, RecoversAnExactCurveFromFivePoints) {
  const std::vector<LossSample> samples =
      Curve(0.02, 0.5, 0.3, {0, 2.5, 5, 7.5, 10});
  const Result<LossCurve> fit = FitLossCurve(samples);
  ASSERT_OK(fit);
  EXPECT_NEAR(fit->c, 0.3, 0.01);
  EXPECT_NEAR(fit->a2, 0.02, 0.002);
  EXPECT_NEAR(fit->b, 0.5, 0.02);
  EXPECT_LT(fit->rms_residual, 1e-4);
  // Predicted time from 2.0 down to 1.0 on the true curve:
  // (1/0.7 - 1/1.7) / 0.02 = 42.0 s.
  const double truth = (1 / 0.7 - 1 / 1.7) / 0.02;
  EXPECT_NEAR(PredictedSecondsToLoss(*fit, 2.0, 1.0), truth, 0.02 * truth);
}

TEST(FitLossCurveTest, ThreePointsAreAnExactSolve) {
  // The authors' case: start, middle and end of a period.
  const std::vector<LossSample> samples = Curve(0.1, 1.0, 0.5, {0, 5, 10});
  const Result<LossCurve> fit = FitLossCurve(samples);
  ASSERT_OK(fit);
  for (const LossSample& s : samples) {
    EXPECT_NEAR(fit->At(s.t_s), s.loss, 1e-4);
  }
  EXPECT_NEAR(fit->c, 0.5, 0.02);
}

TEST(FitLossCurveTest, ToleratesMildNoise) {
  std::vector<LossSample> samples =
      Curve(0.05, 0.6, 0.25, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  const double jitter[] = {+1, -1, +0.5, -0.5, +1, 0, -1, +0.5, -0.5, +1, -1};
  for (size_t i = 0; i < samples.size(); ++i) {
    samples[i].loss *= 1 + 0.004 * jitter[i];
  }
  const Result<LossCurve> fit = FitLossCurve(samples);
  ASSERT_OK(fit);
  const double truth = (1 / (1.2 - 0.25) - 1 / (1.8 - 0.25)) / 0.05;
  EXPECT_NEAR(PredictedSecondsToLoss(*fit, 1.8, 1.2), truth, 0.15 * truth);
}

TEST(FitLossCurveTest, AStraightFallFitsWithAFarPlateau) {
  const std::vector<LossSample> samples = {{0, 2.0}, {5, 1.9}, {10, 1.8}};
  const Result<LossCurve> fit = FitLossCurve(samples);
  ASSERT_OK(fit);
  // 0.02 per second: 1.8 -> 1.7 takes about 5 s.
  EXPECT_NEAR(PredictedSecondsToLoss(*fit, 1.8, 1.7), 5.0, 0.3);
}

TEST(FitLossCurveTest, DegenerateDataIsAnErrorNotACrash) {
  struct Case {
    const char* name;
    std::vector<LossSample> samples;
  };
  const Case cases[] = {
      {"empty", {}},
      {"two points", {{0, 2.0}, {10, 1.0}}},
      {"three samples, two times", {{0, 2.0}, {0, 1.9}, {10, 1.0}}},
      {"NaN leaves two", {{0, 2.0}, {5, kNaN}, {10, 1.0}}},
      {"Inf time", {{0, 2.0}, {kInf, 1.5}, {10, 1.0}}},
      {"flat", {{0, 1.0}, {5, 1.0}, {10, 1.0}}},
      {"flat within 0.1%", {{0, 1.0}, {5, 1.0004}, {10, 0.9998}}},
      {"increasing", {{0, 1.0}, {5, 1.2}, {10, 1.5}}},
      {"noisy",
       {{0, 1.0}, {2, 0.6}, {4, 0.95}, {6, 0.55}, {8, 0.9}, {10, 0.58}}},
      {"zigzag up", {{0, 1.0}, {5, 0.5}, {10, 1.0}}},
      {"all zero", {{0, 0}, {5, 0}, {10, 0}}},
  };
  for (const Case& c : cases) {
    const Result<LossCurve> fit = FitLossCurve(c.samples);
    EXPECT_FALSE(fit.ok()) << c.name << ": a2 " << fit->a2;
    if (!fit.ok()) {
      EXPECT_EQ(fit.status().code(), StatusCode::kFailedPrecondition) << c.name;
    }
  }
}

TEST(PredictedSecondsToLossTest, UnreachableTargetsAreInfiniteNeverNaN) {
  const LossCurve curve{0.1, 1.0, 0.5, 0};
  EXPECT_DOUBLE_EQ(PredictedSecondsToLoss(curve, 1.5, 1.0),
                   (1 / 0.5 - 1 / 1.0) / 0.1);
  EXPECT_EQ(PredictedSecondsToLoss(curve, 1.5, 0.5), kInf);  // the plateau
  EXPECT_EQ(PredictedSecondsToLoss(curve, 1.5, 0.3), kInf);  // below it
  EXPECT_EQ(PredictedSecondsToLoss(curve, 1.0, 1.5), kInf);  // uphill
  EXPECT_EQ(PredictedSecondsToLoss(curve, 1.0, 1.0), kInf);
  EXPECT_EQ(PredictedSecondsToLoss(curve, kNaN, 1.0), kInf);
  EXPECT_EQ(PredictedSecondsToLoss(curve, 1.5, kNaN), kInf);
  EXPECT_EQ(PredictedSecondsToLoss(LossCurve{0, 1, 0.5, 0}, 1.5, 1.0), kInf);
  EXPECT_EQ(PredictedSecondsToLoss(LossCurve{kNaN, 1, 0.5, 0}, 1.5, 1.0), kInf);
}

TEST(PredictedSecondsToLossTest, AFasterCurveScoresShorter) {
  const std::vector<LossSample> slow = Curve(0.02, 0.5, 0.3, {0, 5, 10});
  const std::vector<LossSample> fast = Curve(0.04, 0.5, 0.3, {0, 5, 10});
  const Result<LossCurve> slow_fit = FitLossCurve(slow);
  const Result<LossCurve> fast_fit = FitLossCurve(fast);
  ASSERT_OK(slow_fit);
  ASSERT_OK(fast_fit);
  const double t_slow = PredictedSecondsToLoss(*slow_fit, 2.0, 1.0);
  const double t_fast = PredictedSecondsToLoss(*fast_fit, 2.0, 1.0);
  EXPECT_NEAR(t_slow / t_fast, 2.0, 0.1);
}

// ---------------------------------------------------------------------------
// The online search, on virtual time against a synthetic training run whose
// loss follows dL/dt = -k (L - c)^2 (so 1/(L - c) grows at rate k, exactly
// the fitted form), with a speed k that depends on the setting.

class SearchHarness {
 public:
  SearchHarness(AdspSearchOptions options,
                std::function<double(const AdspSetting&)> speed)
      : search_(std::move(options)), speed_(std::move(speed)) {}

  // Runs `seconds` in ticks of 10 ms; answers every evaluation at once.
  void Run(double seconds) {
    const int ticks = static_cast<int>(std::lround(seconds / 0.01));
    for (int i = 0; i < ticks; ++i) {
      if (!started_) {
        search_.Start(now_);
        started_ = true;
      }
      if (search_.Advance(now_)) {
        ++evaluations_;
        const double reported =
            override_ ? override_(ToSeconds(now_), loss_) : loss_;
        if (!drop_evaluations_) search_.OnLossEvaluation(reported, now_);
      }
      // Exact step of dL/dt = -k (L - c)^2 over 10 ms.
      const double k = speed_(search_.setting());
      inv_ += k * 0.01;
      loss_ = kPlateau + 1 / inv_;
      now_ += FromSeconds(0.01);
    }
  }

  AdspSearch& search() { return search_; }
  double loss() const { return loss_; }
  uint64_t evaluations() const { return evaluations_; }
  void set_loss(double loss) {
    loss_ = loss;
    inv_ = 1 / (loss - kPlateau);
  }
  void set_drop_evaluations(bool drop) { drop_evaluations_ = drop; }
  // Replaces the reported loss: f(now_s, true_loss).
  void set_override(std::function<double(double, double)> f) {
    override_ = std::move(f);
  }

  static constexpr double kPlateau = 0.2;

 private:
  AdspSearch search_;
  std::function<double(const AdspSetting&)> speed_;
  std::function<double(double, double)> override_;
  Duration now_{0};
  bool started_ = false;
  bool drop_evaluations_ = false;
  double inv_ = 1 / (2.3 - kPlateau);
  double loss_ = 2.3;
  uint64_t evaluations_ = 0;
};

AdspSearchOptions Options(uint32_t initial) {
  AdspSearchOptions options;
  options.period_s = 10;
  options.initial_commits = initial;
  options.min_commits = 1;
  options.max_commits = 40;
  options.search_period_s = 0;  // one search unless forced
  options.samples_per_period = 5;
  options.min_improvement = 0.05;
  return options;
}

// Fastest at dC = 12, falling off on both sides.
double PeakAt12(const AdspSetting& s) {
  const double x = (static_cast<double>(s.commits_per_period) - 12) / 4;
  return 0.08 * std::exp(-x * x);
}

TEST(AdspSearchTest, ClimbsUpToTheBestCommitRate) {
  SearchHarness h(Options(5), PeakAt12);
  h.Run(1);
  EXPECT_TRUE(h.search().searching());
  EXPECT_EQ(h.search().searches_started(), 1u);
  h.Run(200);
  EXPECT_FALSE(h.search().searching());
  EXPECT_NEAR(h.search().setting().commits_per_period, 12, 1);
  EXPECT_FALSE(h.search().setting().momentum.has_value());
  // 5 -> 12 and one more to see 13 is no better: 9 candidates of 10 s.
  EXPECT_GE(h.search().candidates_scored(), 8u);
  EXPECT_NEAR(h.search().search_time_s(), 10.0 * h.search().candidates_scored(),
              10.0);
}

TEST(AdspSearchTest, LowersTheCommitRateToo) {
  // The authors' hill-climb never lowers dC; ours does.
  SearchHarness h(Options(20), PeakAt12);
  h.Run(250);
  EXPECT_FALSE(h.search().searching());
  EXPECT_NEAR(h.search().setting().commits_per_period, 12, 1);
}

TEST(AdspSearchTest, SearchesTheMomentumGridAfterTheRate) {
  AdspSearchOptions options = Options(12);
  options.momentum_grid = {0, 0.3, 0.6};
  SearchHarness h(options, [](const AdspSetting& s) {
    const double mu = s.momentum.value_or(-1);
    return PeakAt12(s) * (std::abs(mu - 0.3) < 1e-9 ? 1.5 : 1.0);
  });
  h.Run(1);
  ASSERT_TRUE(h.search().setting().momentum.has_value());
  EXPECT_EQ(*h.search().setting().momentum, 0);  // the grid's first
  h.Run(150);
  EXPECT_FALSE(h.search().searching());
  EXPECT_EQ(h.search().setting().commits_per_period, 12u);
  ASSERT_TRUE(h.search().setting().momentum.has_value());
  EXPECT_DOUBLE_EQ(*h.search().setting().momentum, 0.3);
}

TEST(AdspSearchTest, DegenerateLossKeepsTheCurrentRate) {
  struct Case {
    const char* name;
    std::function<double(double, double)> loss;
    bool resets = false;
  };
  const Case cases[] = {
      {"flat", [](double, double) { return 1.0; }},
      {"increasing", [](double t, double) { return 1.0 + 0.01 * t; }},
      {"noisy",  // 1.3, 0.7, 1.3, ...: no trend, no curve
       [n = 0](double, double) mutable { return (n++ % 2) ? 0.7 : 1.3; }, true},
      {"NaN", [](double, double) { return kNaN; }},
      {"Inf", [](double, double) { return kInf; }},
  };
  for (const Case& c : cases) {
    AdspSearchOptions options = Options(7);
    options.momentum_grid = {0.6, 0};
    SearchHarness h(options, PeakAt12);
    h.set_override(c.loss);
    h.Run(100);
    EXPECT_EQ(h.search().setting().commits_per_period, 7u) << c.name;
    EXPECT_EQ(h.search().setting().momentum.value_or(-1), 0.6) << c.name;
    EXPECT_TRUE(std::isfinite(h.search().search_time_s())) << c.name;
    EXPECT_GT(h.evaluations(), 0u) << c.name;
    if (c.resets) {
      // Checkpoints alternating 0.7 and 1.3 are 86% jumps: each forces a
      // new search, which again keeps the setting.
      EXPECT_GT(h.search().searches_started(), 1u) << c.name;
    } else {
      EXPECT_FALSE(h.search().searching()) << c.name;
      EXPECT_EQ(h.search().searches_started(), 1u) << c.name;
    }
  }
}

TEST(AdspSearchTest, MissingEvaluationsTimeOutAndKeepTheRate) {
  SearchHarness h(Options(7), PeakAt12);
  h.set_drop_evaluations(true);
  h.Run(14);
  EXPECT_TRUE(h.search().searching());  // waits half a period for the end
  h.Run(2);
  EXPECT_FALSE(h.search().searching());
  EXPECT_EQ(h.search().setting().commits_per_period, 7u);
  EXPECT_NEAR(h.search().search_time_s(), 15, 0.05);
}

TEST(AdspSearchTest, DisabledNeverSearchesNorAsks) {
  AdspSearchOptions options = Options(7);
  options.enabled = false;
  SearchHarness h(options, PeakAt12);
  h.Run(100);
  EXPECT_EQ(h.search().searches_started(), 0u);
  EXPECT_EQ(h.evaluations(), 0u);
  EXPECT_EQ(h.search().setting().commits_per_period, 7u);
}

TEST(AdspSearchTest, LossJumpForcesASearchMildRiseDoesNot) {
  SearchHarness h(Options(12), PeakAt12);
  h.Run(100);
  ASSERT_FALSE(h.search().searching());
  ASSERT_EQ(h.search().searches_started(), 1u);
  // Between searches: one checkpoint evaluation per period.
  const uint64_t before = h.evaluations();
  h.Run(50);
  EXPECT_NEAR(static_cast<double>(h.evaluations() - before), 5, 1);
  EXPECT_EQ(h.search().searches_started(), 1u);
  // A rise below 20% is tolerated, a doubling is not.
  h.set_loss(h.loss() * 1.2);
  h.Run(20);
  EXPECT_EQ(h.search().searches_started(), 1u);
  h.set_loss(h.loss() * 2);
  h.Run(20);
  EXPECT_EQ(h.search().searches_started(), 2u);
  EXPECT_TRUE(h.search().searching());
}

TEST(AdspSearchTest, ResearchesPeriodically) {
  AdspSearchOptions options = Options(12);
  options.search_period_s = 60;
  SearchHarness h(options, PeakAt12);
  h.Run(60);
  ASSERT_EQ(h.search().searches_started(), 1u);
  ASSERT_FALSE(h.search().searching());  // done after 3 candidates
  h.Run(70);
  EXPECT_EQ(h.search().searches_started(), 2u);
  EXPECT_NEAR(h.search().setting().commits_per_period, 12, 1);
}

// ---------------------------------------------------------------------------
// ADACOMM.

TEST(AdacommTauTest, SquareRootOfTheLossRatio) {
  EXPECT_EQ(AdacommTau(2.0, 2.0, 40), 40u);
  EXPECT_EQ(AdacommTau(0.5, 2.0, 40), 20u);    // sqrt(1/4) * 40
  EXPECT_EQ(AdacommTau(1.0, 2.0, 40), 29u);    // ceil(28.28)
  EXPECT_EQ(AdacommTau(0.0002, 2.0, 40), 1u);  // ceil(0.4)
  EXPECT_EQ(AdacommTau(4.0, 2.0, 40), 40u);    // capped at tau0
  EXPECT_EQ(AdacommTau(0, 2.0, 40), 1u);
  EXPECT_EQ(AdacommTau(1.0, 0, 40), 40u);  // no ratio
  EXPECT_EQ(AdacommTau(kNaN, 2.0, 40), 40u);
  EXPECT_EQ(AdacommTau(1.0, 2.0, 0), 1u);
}

TEST(ChooseAdacommTau0Test, FastestLossDecreaseWins) {
  const std::vector<Tau0Trial> trials = {
      {1, 2.3, 2.0, 60},                       // 0.005/s
      {10, 2.3, 1.6, 60},                      // 0.0117/s
      {20, 2.3, 1.4, 60},                      // 0.015/s
      {40, 2.3, 1.4, 60},                      // tie: the smaller tau wins
      {80, 2.3, 1.9, 60},  {0, 2.3, 0.1, 60},  // skipped: tau 0
      {60, 2.3, kNaN, 60},                     // skipped
      {100, 2.3, 0.1, 0},                      // skipped: no time
  };
  const Result<uint32_t> tau0 = ChooseAdacommTau0(trials);
  ASSERT_OK(tau0);
  EXPECT_EQ(*tau0, 20u);

  const std::vector<Tau0Trial> none_better = {{5, 1.0, 1.1, 60}};
  EXPECT_FALSE(ChooseAdacommTau0(none_better).ok());
  EXPECT_FALSE(ChooseAdacommTau0({}).ok());
}

}  // namespace
}  // namespace meridian
