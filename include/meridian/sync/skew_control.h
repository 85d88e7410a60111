// SkewScout's communication control (Hsieh et al., ICML'20, "The Non-IID
// Data Quagmire of Decentralized Machine Learning"): a site's model
// travels to a peer, which scores it and its own model on a held-out
// sample of its own training data; the gap between the two is the
// accuracy the peer's data would lose to skew if the sites kept drifting
// apart. The controller keeps that estimated loss near a target by moving
// the active algorithm's communication knob — Gaia's θ, FedAvg's averaging
// period, the density of top-k — towards more communication when the loss
// is high and back towards less when it stays low, within bounds. The
// authors' code has no such loop (../shared/reference/skewscout.md §2); its
// shape (multiplicative steps, a dead band, patience before loosening) is
// ours, after the code's bandwidth controller. Pure logic on values: the
// site server feeds it results and applies the knob. Not thread-safe.
#ifndef MERIDIAN_SYNC_SKEW_CONTROL_H_
#define MERIDIAN_SYNC_SKEW_CONTROL_H_

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>

#include "meridian/config/config.h"
#include "meridian/job.pb.h"
#include "meridian/core/status.h"

namespace meridian {

struct SkewControlOptions {
  // The skew-induced accuracy loss to stay within (a fraction: 0.01 is
  // one point).
  double target_loss = 0.01;
  // No change while the smoothed loss is within target × (1 ± dead_band).
  double dead_band = 0.25;
  // Weight of a new estimate in the smoothed loss (1: no smoothing). One
  // estimate scores a few hundred samples, so it is noisy.
  double smoothing = 0.5;
  // A high loss moves the knob by this factor towards more communication;
  // a loss that stayed low for `patience` estimates in a row moves it by
  // loosen_factor towards less. Tighten fast, loosen slowly.
  double tighten_factor = 2.0;
  double loosen_factor = 1.25;
  uint32_t patience = 2;
  // Bounds of the knob (both > 0).
  double min_knob = 0.005;
  double max_knob = 0.5;
  // true for θ and the averaging period (a larger knob sends less); false
  // for a density (a larger knob sends more).
  bool larger_is_looser = true;
  // An estimate is noise until it is this many standard errors from the
  // target: the band becomes max(dead band, z × the smoothed estimate's
  // standard error) on either side. 0: the dead band alone.
  double significance_z = 2.0;
  // Clocks between travels: `min_period` while the loss is high, doubled
  // after each estimate below the band up to `max_period` (a skew that
  // stays low needs watching less often), back to `min_period` when the
  // knob tightens. Both >= 1, min_period <= max_period.
  uint32_t min_period = 200;
  uint32_t max_period = 1600;
};

// The options of a job's `sync.skewscout` (validated by the config): a
// threshold knob (larger is looser) in [min_theta, max_theta].
SkewControlOptions SkewControlOptionsFrom(const pb::SkewScoutConfig& config);

// The options for the knob of `sync` (SkewKnobOf, config.h; validated by
// the config): θ in [min_theta, max_theta], a density in [min_density,
// max_density] (larger sends more), or an averaging period in
// [min_averaging_period, max_averaging_period]; and where the knob starts
// (sync.threshold, compression.top_k_fraction or sync.averaging_period).
SkewControlOptions SkewControlOptionsFrom(const pb::SyncConfig& sync);
double InitialKnob(const pb::SyncConfig& sync);

// The averaging period (whole clocks) a site proposes when its controller's
// knob is `knob`: rounded to the nearest clock, within [min_averaging_period,
// max_averaging_period] of `config`.
uint32_t ProposedPeriod(double knob, const pb::SkewScoutConfig& config);

enum class SkewAction { kHold, kTighten, kLoosen };
const char* SkewActionName(SkewAction action);
// The action SkewActionName names; kHold for any other name.
SkewAction SkewActionFromName(std::string_view name);

// How a travelled model and the scoring site's own model did on the same
// held-out samples (a paired comparison).
// What the two scores are. A built-in classifier scores both models on the
// same samples and counts where they disagree (kPairedAccuracy); an
// evaluator process reports one metric per model (ModelConfig.metrics'
// first): a proportion where higher is better, such as accuracy
// (kAccuracy), or any other metric (kRelative), whose scores are then the
// metric oriented so that higher is better (a loss or perplexity negated).
enum class ScoreKind { kPairedAccuracy, kAccuracy, kRelative };

struct TravelScores {
  uint32_t samples = 0;
  double own_accuracy = 0;        // the scoring site's model
  double travelled_accuracy = 0;  // the travelled model
  // Samples exactly one of the two classified correctly (0: unknown, or
  // the models agree on every sample). kPairedAccuracy only.
  uint32_t discordant = 0;
  ScoreKind kind = ScoreKind::kPairedAccuracy;
  // What the scoring site's data loses to skew: own - travelled for
  // accuracies; (own - travelled) / |own| for other metrics (the relative
  // degradation: 0.02 is a 2% worse loss or perplexity).
  double Estimate() const;
  // Standard error of Estimate() over the sampling of the held-out set:
  // paired proportions (McNemar), sqrt((discordant/n - estimate²) / n);
  // two proportions sampled apart, sqrt((p(1-p) + q(1-q)) / n); unknown (0)
  // for other metrics and when samples is 0.
  double StandardError() const;
  // Whether the controller can use it: a sample count, scores it can read
  // (accuracies in [0, 1]; a non-zero, finite own score otherwise).
  bool Usable() const;
};

// One estimate and what the controller did with it.
struct SkewDecision {
  double t_s = 0;     // job time of the estimate
  int64_t clock = 0;  // the travelled model's clock
  std::string peer;   // where it travelled (and was scored)
  uint32_t samples = 0;
  double own_accuracy = 0;        // the peer's model on its own sample
  double travelled_accuracy = 0;  // this site's model on that sample
  uint32_t discordant = 0;
  double estimate = 0;  // own - travelled
  double smoothed = 0;  // the controller's running estimate
  // Standard error of `smoothed` (from the estimate's; 0 when unknown).
  double standard_error = 0;
  uint32_t travel_period = 0;  // clocks to the next travel, after this
  double knob_before = 0;
  double knob_after = 0;
  SkewAction action = SkewAction::kHold;
};

class SkewController {
 public:
  // Decisions kept (the oldest are dropped first).
  static constexpr size_t kMaxDecisions = 1000;

  // InvalidArgument naming the option for: target_loss <= 0, dead_band
  // outside [0, 1), smoothing outside (0, 1], a factor <= 1, patience 0,
  // bounds not 0 < min <= max, significance_z < 0, periods not
  // 1 <= min <= max, an initial knob outside the bounds, or any value not
  // finite.
  static Result<SkewController> Create(const SkewControlOptions& options,
                                       double initial_knob);

  // A travel result: the peer scored its own model and the travelled one
  // on `scores.samples` of its training data (accuracies in [0, 1],
  // discordant <= samples; a result with no samples or a value outside is
  // recorded as a hold and not used). Returns the decision.
  const SkewDecision& Observe(double t_s, int64_t clock,
                              const std::string& peer,
                              const TravelScores& scores);
  // The same, for scores without a discordant count.
  const SkewDecision& Observe(double t_s, int64_t clock,
                              const std::string& peer, uint32_t samples,
                              double own_accuracy, double travelled_accuracy);

  // What a site's checkpoint keeps of the controller, so that a restarted
  // site continues with the knob it had learnt instead of starting over.
  struct State {
    double knob = 0;
    uint32_t travel_period = 0;
    double smoothed = 0;
    double smoothed_variance = 0;
    uint64_t estimates = 0;
    uint32_t low_in_a_row = 0;
    uint64_t tightened = 0;
    uint64_t loosened = 0;
    std::deque<SkewDecision> decisions;
  };
  State Save() const;
  // Continues from `state` (a checkpoint's, read from disk): the knob and
  // period are clamped into this controller's bounds, non-finite values
  // and a negative variance leave the current ones, at most kMaxDecisions
  // (the newest) are kept.
  void Restore(State state);

  double knob() const { return knob_; }
  // Clocks from one travel to the next.
  uint32_t travel_period() const { return period_; }
  double smoothed_loss() const { return smoothed_; }
  bool has_estimate() const { return estimates_ > 0; }
  const std::deque<SkewDecision>& decisions() const { return decisions_; }
  uint64_t tightened() const { return tightened_; }
  uint64_t loosened() const { return loosened_; }

 private:
  SkewController(const SkewControlOptions& options, double initial_knob);
  double Moved(double factor_towards_more_communication) const;

  SkewControlOptions options_;
  double knob_;
  uint32_t period_;
  double smoothed_ = 0;
  double smoothed_variance_ = 0;
  uint64_t estimates_ = 0;
  uint32_t low_in_a_row_ = 0;
  uint64_t tightened_ = 0;
  uint64_t loosened_ = 0;
  std::deque<SkewDecision> decisions_;
};

}  // namespace meridian

#endif  // MERIDIAN_SYNC_SKEW_CONTROL_H_
