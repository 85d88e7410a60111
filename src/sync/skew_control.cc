#include "meridian/sync/skew_control.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

namespace meridian {
namespace {

Status Invalid(const std::string& option, double value,
               const std::string& allowed) {
  return InvalidArgumentError("skew control: " + option + " is " +
                              std::to_string(value) + "; allowed: " + allowed);
}

}  // namespace

SkewControlOptions SkewControlOptionsFrom(const pb::SkewScoutConfig& config) {
  SkewControlOptions options;
  options.target_loss = config.target_loss();
  options.dead_band = config.dead_band();
  options.smoothing = config.smoothing();
  options.tighten_factor = config.tighten_factor();
  options.loosen_factor = config.loosen_factor();
  options.patience = config.patience();
  options.min_knob = config.min_theta();
  options.max_knob = config.max_theta();
  options.larger_is_looser = true;
  options.significance_z = config.significance_z();
  options.min_period = config.travel_period();
  options.max_period =
      config.max_travel_period() > 0
          ? config.max_travel_period()
          : static_cast<uint32_t>(std::min<uint64_t>(
                8 * uint64_t{config.travel_period()}, UINT32_MAX));
  return options;
}

double TravelScores::Estimate() const {
  if (kind == ScoreKind::kRelative) {
    return (own_accuracy - travelled_accuracy) / std::abs(own_accuracy);
  }
  return own_accuracy - travelled_accuracy;
}

double TravelScores::StandardError() const {
  if (samples == 0) return 0;
  const double n = samples;
  switch (kind) {
    case ScoreKind::kPairedAccuracy: {
      const double estimate = Estimate();
      return std::sqrt(std::max(0.0, discordant / n - estimate * estimate) /
                       n);
    }
    case ScoreKind::kAccuracy: {
      const double p = own_accuracy, q = travelled_accuracy;
      return std::sqrt(std::max(0.0, p * (1 - p) + q * (1 - q)) / n);
    }
    case ScoreKind::kRelative:
      return 0;
  }
  return 0;
}

bool TravelScores::Usable() const {
  if (samples == 0) return false;
  if (kind == ScoreKind::kRelative) {
    return std::isfinite(own_accuracy) && std::isfinite(travelled_accuracy) &&
           own_accuracy != 0;
  }
  return own_accuracy >= 0 && own_accuracy <= 1 && travelled_accuracy >= 0 &&
         travelled_accuracy <= 1 && discordant <= samples;
}

SkewControlOptions SkewControlOptionsFrom(const pb::SyncConfig& sync) {
  SkewControlOptions options = SkewControlOptionsFrom(sync.skewscout());
  switch (SkewKnobOf(sync)) {
    case SkewKnob::kTopKDensity:
      options.min_knob = sync.skewscout().min_density();
      options.max_knob = sync.skewscout().max_density();
      options.larger_is_looser = false;
      break;
    case SkewKnob::kAveragingPeriod:
      options.min_knob = sync.skewscout().min_averaging_period();
      options.max_knob = sync.skewscout().max_averaging_period();
      options.larger_is_looser = true;
      break;
    case SkewKnob::kTheta:
      break;
  }
  return options;
}

double InitialKnob(const pb::SyncConfig& sync) {
  switch (SkewKnobOf(sync)) {
    case SkewKnob::kTopKDensity:
      return sync.compression().top_k_fraction();
    case SkewKnob::kAveragingPeriod:
      return sync.averaging_period();
    case SkewKnob::kTheta:
    default:
      return sync.threshold();
  }
}

uint32_t ProposedPeriod(double knob, const pb::SkewScoutConfig& config) {
  const double low = config.min_averaging_period();
  const double high = config.max_averaging_period();
  const double clamped =
      std::isfinite(knob) ? std::clamp(knob, low, high) : high;
  return static_cast<uint32_t>(std::lround(clamped));
}

namespace {

// Each action's name in report.json and checkpoints, read both ways.
constexpr std::pair<SkewAction, const char*> kSkewActionNames[] = {
    {SkewAction::kHold, "hold"},
    {SkewAction::kTighten, "tighten"},
    {SkewAction::kLoosen, "loosen"},
};

}  // namespace

const char* SkewActionName(SkewAction action) {
  for (const auto& [known, name] : kSkewActionNames) {
    if (known == action) return name;
  }
  return "hold";
}

SkewAction SkewActionFromName(std::string_view name) {
  for (const auto& [action, known] : kSkewActionNames) {
    if (name == known) return action;
  }
  return SkewAction::kHold;
}

Result<SkewController> SkewController::Create(const SkewControlOptions& options,
                                              double initial_knob) {
  const SkewControlOptions& o = options;
  for (auto [name, value] :
       {std::pair<const char*, double>{"target_loss", o.target_loss},
        {"dead_band", o.dead_band},
        {"smoothing", o.smoothing},
        {"tighten_factor", o.tighten_factor},
        {"loosen_factor", o.loosen_factor},
        {"min_knob", o.min_knob},
        {"max_knob", o.max_knob},
        {"significance_z", o.significance_z},
        {"initial knob", initial_knob}}) {
    if (!std::isfinite(value)) return Invalid(name, value, "a finite number");
  }
  if (!(o.target_loss > 0)) return Invalid("target_loss", o.target_loss, "> 0");
  if (!(o.dead_band >= 0 && o.dead_band < 1)) {
    return Invalid("dead_band", o.dead_band, "[0, 1)");
  }
  if (!(o.smoothing > 0 && o.smoothing <= 1)) {
    return Invalid("smoothing", o.smoothing, "(0, 1]");
  }
  if (!(o.tighten_factor > 1)) {
    return Invalid("tighten_factor", o.tighten_factor, "> 1");
  }
  if (!(o.loosen_factor > 1)) {
    return Invalid("loosen_factor", o.loosen_factor, "> 1");
  }
  if (o.patience == 0) return Invalid("patience", 0, ">= 1");
  if (!(o.min_knob > 0 && o.min_knob <= o.max_knob)) {
    return Invalid("min_knob", o.min_knob, "(0, max_knob]");
  }
  if (!(o.significance_z >= 0)) {
    return Invalid("significance_z", o.significance_z, ">= 0");
  }
  if (o.min_period == 0 || o.min_period > o.max_period) {
    return Invalid("min_period", o.min_period, "[1, max_period]");
  }
  if (!(initial_knob >= o.min_knob && initial_knob <= o.max_knob)) {
    // Appended piece by piece: GCC 12 warns (-Wrestrict, falsely) on one
    // long chain of string additions.
    std::string bounds = "[";
    bounds += std::to_string(o.min_knob);
    bounds += ", ";
    bounds += std::to_string(o.max_knob);
    bounds += "]";
    return Invalid("initial knob", initial_knob, bounds);
  }
  return SkewController(options, initial_knob);
}

SkewController::SkewController(const SkewControlOptions& options,
                               double initial_knob)
    : options_(options), knob_(initial_knob), period_(options.min_period) {}

SkewController::State SkewController::Save() const {
  State state;
  state.knob = knob_;
  state.travel_period = period_;
  state.smoothed = smoothed_;
  state.smoothed_variance = smoothed_variance_;
  state.estimates = estimates_;
  state.low_in_a_row = low_in_a_row_;
  state.tightened = tightened_;
  state.loosened = loosened_;
  state.decisions = decisions_;
  return state;
}

void SkewController::Restore(State state) {
  if (std::isfinite(state.knob)) {
    knob_ = std::clamp(state.knob, options_.min_knob, options_.max_knob);
  }
  period_ =
      std::clamp(state.travel_period, options_.min_period, options_.max_period);
  if (std::isfinite(state.smoothed) && std::isfinite(state.smoothed_variance) &&
      state.smoothed_variance >= 0) {
    smoothed_ = state.smoothed;
    smoothed_variance_ = state.smoothed_variance;
    estimates_ = state.estimates;
  }
  low_in_a_row_ = std::min(state.low_in_a_row, options_.patience);
  tightened_ = state.tightened;
  loosened_ = state.loosened;
  decisions_ = std::move(state.decisions);
  while (decisions_.size() > kMaxDecisions) decisions_.pop_front();
}

double SkewController::Moved(double factor) const {
  // factor > 1: towards more communication.
  const double moved =
      options_.larger_is_looser ? knob_ / factor : knob_ * factor;
  return std::clamp(moved, options_.min_knob, options_.max_knob);
}

const SkewDecision& SkewController::Observe(double t_s, int64_t clock,
                                            const std::string& peer,
                                            uint32_t samples,
                                            double own_accuracy,
                                            double travelled_accuracy) {
  TravelScores scores;
  scores.samples = samples;
  scores.own_accuracy = own_accuracy;
  scores.travelled_accuracy = travelled_accuracy;
  return Observe(t_s, clock, peer, scores);
}

const SkewDecision& SkewController::Observe(double t_s, int64_t clock,
                                            const std::string& peer,
                                            const TravelScores& scores) {
  SkewDecision decision;
  decision.t_s = t_s;
  decision.clock = clock;
  decision.peer = peer;
  decision.samples = scores.samples;
  decision.own_accuracy = scores.own_accuracy;
  decision.travelled_accuracy = scores.travelled_accuracy;
  decision.discordant = scores.discordant;
  decision.knob_before = knob_;
  if (scores.Usable()) {
    decision.estimate = scores.Estimate();
    const double variance = scores.StandardError() * scores.StandardError();
    const double a = options_.smoothing;
    if (estimates_ == 0) {
      smoothed_ = decision.estimate;
      smoothed_variance_ = variance;
    } else {
      // Estimates are independent samples: the running mean's variance
      // follows the same weights, squared.
      smoothed_ = a * decision.estimate + (1 - a) * smoothed_;
      smoothed_variance_ =
          a * a * variance + (1 - a) * (1 - a) * smoothed_variance_;
    }
    ++estimates_;
    const double target = options_.target_loss;
    const double noise =
        options_.significance_z * std::sqrt(smoothed_variance_);
    const double high =
        std::max(target * (1 + options_.dead_band), target + noise);
    const double low =
        std::min(target * (1 - options_.dead_band), target - noise);
    if (smoothed_ > high) {
      low_in_a_row_ = 0;
      period_ = options_.min_period;
      const double moved = Moved(options_.tighten_factor);
      if (moved != knob_) {
        knob_ = moved;
        decision.action = SkewAction::kTighten;
        ++tightened_;
      }
    } else if (smoothed_ < low) {
      period_ = std::min(options_.max_period, 2 * period_);
      if (++low_in_a_row_ >= options_.patience) {
        low_in_a_row_ = 0;
        const double moved = Moved(1 / options_.loosen_factor);
        if (moved != knob_) {
          knob_ = moved;
          decision.action = SkewAction::kLoosen;
          ++loosened_;
        }
      }
    } else {
      low_in_a_row_ = 0;
    }
  }
  decision.smoothed = smoothed_;
  decision.standard_error = std::sqrt(smoothed_variance_);
  decision.knob_after = knob_;
  decision.travel_period = period_;
  decisions_.push_back(std::move(decision));
  if (decisions_.size() > kMaxDecisions) decisions_.pop_front();
  return decisions_.back();
}

}  // namespace meridian
