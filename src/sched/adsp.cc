#include "sched/adsp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "meridian/core/format.h"

namespace meridian {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A loss range below this fraction of the loss's magnitude is flat.
constexpr double kFlatRelativeRange = 1e-3;
// A fit whose RMS residual exceeds this fraction of the loss range is noise.
constexpr double kMaxRelativeResidual = 0.25;
// The plateau c is searched at lo - g * range for g in [kMinGap, kMaxGap]:
// from just below the lowest loss to far below it (a nearly straight fall).
constexpr double kMinGap = 1e-4;
constexpr double kMaxGap = 1e4;
constexpr int kGapSteps = 161;  // 20 per decade
constexpr int kGoldenIterations = 80;

struct LineFit {
  double a2 = 0;
  double b = 0;
  double sse = kInf;
};

// For a fixed plateau c: weighted least squares of 1/(l - c) on t, then the
// residual in loss units. sse = +inf when the line does not describe a
// falling curve (a2 <= 0, b <= 0) or anything is not finite.
LineFit FitForPlateau(const std::vector<LossSample>& points, double c) {
  double sw = 0, swt = 0, swy = 0, swtt = 0, swty = 0;
  double max_w = 0;
  for (const LossSample& p : points) {
    max_w = std::max(max_w, std::pow(p.loss - c, 4));
  }
  if (!(max_w > 0) || !std::isfinite(max_w)) return {};
  for (const LossSample& p : points) {
    const double d = p.loss - c;  // > 0: c is below every loss
    const double w = std::pow(d, 4) / max_w;
    const double y = 1.0 / d;
    sw += w;
    swt += w * p.t_s;
    swy += w * y;
    swtt += w * p.t_s * p.t_s;
    swty += w * p.t_s * y;
  }
  const double den = sw * swtt - swt * swt;
  if (!(den > 0)) return {};
  LineFit fit;
  fit.a2 = (sw * swty - swt * swy) / den;
  fit.b = (swy - fit.a2 * swt) / sw;
  if (!(fit.a2 > 0) || !(fit.b > 0) || !std::isfinite(fit.a2) ||
      !std::isfinite(fit.b)) {
    return {};
  }
  double sse = 0;
  for (const LossSample& p : points) {
    const double r = 1.0 / (fit.a2 * p.t_s + fit.b) + c - p.loss;
    sse += r * r;
  }
  fit.sse = std::isfinite(sse) ? sse : kInf;
  return fit;
}

}  // namespace

// ---------------------------------------------------------------------------
// Commit interval.

double AdspCommitInterval(double period_s, uint32_t commits_per_period,
                          double overhead_s, double min_interval_s) {
  const double floor_s =
      std::isfinite(min_interval_s) ? std::max(min_interval_s, 0.0) : 0.0;
  const double overhead =
      std::isfinite(overhead_s) ? std::max(overhead_s, 0.0) : 0.0;
  const double target =
      period_s / static_cast<double>(std::max<uint32_t>(commits_per_period, 1));
  const double interval = target - overhead;
  if (!std::isfinite(interval)) return floor_s;
  return std::max(floor_s, interval);
}

double AdspLinkFloor(double round_trip_s, double max_fraction,
                     double period_s) {
  if (!(max_fraction > 0 && max_fraction < 1)) return 0;
  if (!(round_trip_s > 0) || !std::isfinite(round_trip_s)) return 0;
  const double floor_s = round_trip_s * (1 - max_fraction) / max_fraction;
  if (!(period_s > 0) || !std::isfinite(period_s)) return floor_s;
  return std::min(floor_s, period_s);
}

void CommitOverheadEstimate::Add(double sample_s) {
  if (!std::isfinite(sample_s)) return;
  const double sample = std::max(sample_s, 0.0);
  value_s_ = samples_ == 0 ? sample : value_s_ + weight_ * (sample - value_s_);
  ++samples_;
}

// ---------------------------------------------------------------------------
// Loss curve.

namespace {

// The samples a loss curve is fitted to: finite, at t >= 0, sorted by
// time, at 3 or more distinct times, and falling.
struct FallingSamples {
  std::vector<LossSample> points;
  double lo = 0;     // the lowest loss
  double range = 0;  // highest - lowest loss, > 0
};

Result<FallingSamples> ParseFallingSamples(
    std::span<const LossSample> samples) {
  FallingSamples parsed;
  std::vector<LossSample>& points = parsed.points;
  points.reserve(samples.size());
  for (const LossSample& s : samples) {
    if (std::isfinite(s.t_s) && std::isfinite(s.loss) && s.t_s >= 0) {
      points.push_back(s);
    }
  }
  std::sort(
      points.begin(), points.end(),
      [](const LossSample& x, const LossSample& y) { return x.t_s < y.t_s; });
  size_t distinct = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    if (i == 0 || points[i].t_s > points[i - 1].t_s) ++distinct;
  }
  if (distinct < 3) {
    return FailedPreconditionError(
        "loss fit needs 3 finite samples at distinct times, got " +
        std::to_string(distinct));
  }
  double lo = kInf, hi = -kInf, mean_t = 0, mean_l = 0;
  for (const LossSample& p : points) {
    lo = std::min(lo, p.loss);
    hi = std::max(hi, p.loss);
    mean_t += p.t_s;
    mean_l += p.loss;
  }
  const double n = static_cast<double>(points.size());
  mean_t /= n;
  mean_l /= n;
  const double range = hi - lo;
  const double size = std::max(std::abs(hi), std::abs(lo));
  if (!(range > kFlatRelativeRange * size) || !(range > 0)) {
    return FailedPreconditionError("loss is flat (range " + FormatReal(range) +
                                   ")");
  }
  double cov = 0, var = 0;
  for (const LossSample& p : points) {
    cov += (p.t_s - mean_t) * (p.loss - mean_l);
    var += (p.t_s - mean_t) * (p.t_s - mean_t);
  }
  if (!(var > 0) || !(cov < 0)) {
    return FailedPreconditionError("loss does not fall (slope " +
                                   FormatReal(var > 0 ? cov / var : 0) + ")");
  }
  parsed.lo = lo;
  parsed.range = range;
  return parsed;
}

// The plateau c of the best fit, as log((lo - c) / range): scans the
// plateau's distance below the lowest loss on a log grid, then refines the
// best cell by golden-section search. nullopt when no gap on the grid
// fits.
std::optional<double> BestLogGap(const FallingSamples& samples) {
  const double log_lo = std::log(kMinGap), log_hi = std::log(kMaxGap);
  auto sse_at = [&](double log_gap) {
    const double plateau = samples.lo - std::exp(log_gap) * samples.range;
    return FitForPlateau(samples.points, plateau).sse;
  };
  int best = -1;
  double best_sse = kInf;
  for (int i = 0; i < kGapSteps; ++i) {
    const double g = log_lo + (log_hi - log_lo) * i / (kGapSteps - 1);
    const double sse = sse_at(g);
    if (sse < best_sse) {
      best_sse = sse;
      best = i;
    }
  }
  if (best < 0) return std::nullopt;
  const double step = (log_hi - log_lo) / (kGapSteps - 1);
  double left = log_lo + step * std::max(best - 1, 0);
  double right = log_lo + step * std::min(best + 1, kGapSteps - 1);
  const double ratio = (std::sqrt(5.0) - 1) / 2;
  double x1 = right - ratio * (right - left);
  double x2 = left + ratio * (right - left);
  double f1 = sse_at(x1), f2 = sse_at(x2);
  for (int i = 0; i < kGoldenIterations; ++i) {
    if (f1 <= f2) {
      right = x2;
      x2 = x1;
      f2 = f1;
      x1 = right - ratio * (right - left);
      f1 = sse_at(x1);
    } else {
      left = x1;
      x1 = x2;
      f1 = f2;
      x2 = left + ratio * (right - left);
      f2 = sse_at(x2);
    }
  }
  double best_log = log_lo + step * best;
  if (std::min(f1, f2) < best_sse) {
    best_log = f1 <= f2 ? x1 : x2;
  }
  return best_log;
}

}  // namespace

Result<LossCurve> FitLossCurve(std::span<const LossSample> samples) {
  MERIDIAN_ASSIGN_OR_RETURN(const FallingSamples falling,
                            ParseFallingSamples(samples));
  const std::optional<double> log_gap = BestLogGap(falling);
  if (!log_gap.has_value()) {
    return FailedPreconditionError("no falling curve 1/(a^2 t + b) + c fits");
  }
  const double c = falling.lo - std::exp(*log_gap) * falling.range;
  const LineFit fit = FitForPlateau(falling.points, c);
  if (!std::isfinite(fit.sse)) {
    return FailedPreconditionError("no falling curve 1/(a^2 t + b) + c fits");
  }
  LossCurve curve;
  curve.a2 = fit.a2;
  curve.b = fit.b;
  curve.c = c;
  curve.rms_residual =
      std::sqrt(fit.sse / static_cast<double>(falling.points.size()));
  if (curve.rms_residual > kMaxRelativeResidual * falling.range) {
    return FailedPreconditionError("loss is too noisy to fit (RMS residual " +
                                   FormatReal(curve.rms_residual) + ", range " +
                                   FormatReal(falling.range) + ")");
  }
  return curve;
}

double PredictedSecondsToLoss(const LossCurve& curve, double from_loss,
                              double to_loss) {
  if (!std::isfinite(from_loss) || !std::isfinite(to_loss) ||
      !std::isfinite(curve.a2) || !std::isfinite(curve.c) || !(curve.a2 > 0) ||
      !(to_loss < from_loss) || !(to_loss > curve.c)) {
    return kInf;
  }
  const double seconds =
      (1.0 / (to_loss - curve.c) - 1.0 / (from_loss - curve.c)) / curve.a2;
  return std::isfinite(seconds) && seconds >= 0 ? seconds : kInf;
}

// ---------------------------------------------------------------------------
// The online search.

AdspSearch::AdspSearch(AdspSearchOptions options)
    : options_(std::move(options)) {
  if (!(options_.period_s > 0) || !std::isfinite(options_.period_s)) {
    options_.period_s = 10;
  }
  options_.min_commits = std::max<uint32_t>(options_.min_commits, 1);
  options_.max_commits = std::max(options_.max_commits, options_.min_commits);
  options_.samples_per_period =
      std::max<uint32_t>(options_.samples_per_period, 3);
  if (!(options_.min_improvement >= 0) || !(options_.min_improvement < 1)) {
    options_.min_improvement = 0;
  }
  setting_.commits_per_period = std::clamp(
      options_.initial_commits, options_.min_commits, options_.max_commits);
  if (!options_.momentum_grid.empty()) {
    setting_.momentum = options_.momentum_grid.front();
  }
}

void AdspSearch::Start(Duration now) {
  last_advance_ = now;
  last_search_end_ = now;
  next_checkpoint_ = now;
  if (options_.enabled) BeginSearch(now);
}

void AdspSearch::BeginSearch(Duration now) {
  ++searches_started_;
  search_start_ = now;
  best_.reset();
  moved_up_ = false;
  force_search_ = false;
  momenta_left_.clear();
  phase_ = Phase::kBase;
  BeginCandidate(setting_, now);
}

void AdspSearch::BeginCandidate(const AdspSetting& setting, Duration now) {
  candidate_ = Candidate{};
  candidate_.setting = setting;
  candidate_.start = now;
  setting_ = setting;
}

bool AdspSearch::Advance(Duration now) {
  last_advance_ = std::max(last_advance_, now);
  if (!options_.enabled) return false;
  const Duration period = FromSeconds(options_.period_s);
  if (phase_ == Phase::kSteady) {
    const bool periodic =
        options_.search_period_s > 0 &&
        ToSeconds(now - last_search_end_) >= options_.search_period_s;
    if (!force_search_ && !periodic) {
      if (now < next_checkpoint_) return false;
      next_checkpoint_ = now + period;
      checkpoint_pending_ = true;
      checkpoint_requested_at_ = now;
      return true;
    }
    BeginSearch(now);
  }
  // The candidate ends when its last sample is in, or half a period after
  // its end without it.
  const bool have_end =
      std::any_of(candidate_.samples.begin(), candidate_.samples.end(),
                  [&](const LossSample& s) {
                    return s.t_s >= options_.period_s * (1 - 1e-9);
                  });
  if (have_end || now >= candidate_.start + period + period / 2) {
    FinishCandidate(now);
    if (phase_ == Phase::kSteady) return false;
  }
  const uint32_t n = options_.samples_per_period;
  const double elapsed_s = ToSeconds(now - candidate_.start);
  // Samples k = 0..n-1 are due at k * period / (n - 1); overdue ones
  // collapse into one evaluation now.
  uint32_t due = 0;
  while (due < n && elapsed_s >= options_.period_s * due / (n - 1)) ++due;
  if (due > candidate_.requested) {
    candidate_.requested = due;
    return true;
  }
  return false;
}

void AdspSearch::OnLossEvaluation(double loss, Duration taken_at) {
  if (!std::isfinite(loss)) return;
  if (phase_ == Phase::kSteady) {
    if (checkpoint_pending_ && taken_at >= checkpoint_requested_at_) {
      checkpoint_pending_ = false;
      OnCheckpoint(loss, taken_at);
    }
    return;
  }
  if (taken_at < candidate_.start) return;  // an earlier candidate's sample
  const double t_s = ToSeconds(taken_at - candidate_.start);
  if (t_s > options_.period_s * 1.5) return;
  candidate_.samples.push_back(LossSample{t_s, loss});
}

void AdspSearch::OnCheckpoint(double loss, Duration /*now*/) {
  if (last_checkpoint_loss_) {
    const double prev = *last_checkpoint_loss_;
    if (prev != 0 && loss - prev >= options_.loss_jump_ratio * std::abs(prev)) {
      force_search_ = true;
    }
  }
  last_checkpoint_loss_ = loss;
}

void AdspSearch::FinishCandidate(Duration now) {
  std::sort(
      candidate_.samples.begin(), candidate_.samples.end(),
      [](const LossSample& x, const LossSample& y) { return x.t_s < y.t_s; });
  Scored scored;
  scored.setting = candidate_.setting;
  if (!candidate_.samples.empty()) {
    scored.start_loss = candidate_.samples.front().loss;
    scored.end_loss = candidate_.samples.back().loss;
  }
  Result<LossCurve> curve = FitLossCurve(candidate_.samples);
  if (curve.ok()) scored.curve = *curve;
  ++candidates_scored_;
  Next(scored, now);
}

bool AdspSearch::Better(const Scored& challenger, const Scored& best) const {
  if (!challenger.curve) return false;
  if (!best.curve) return true;
  const double from = std::max(challenger.start_loss, best.start_loss);
  const double to = std::min(challenger.end_loss, best.end_loss);
  const double t_challenger =
      PredictedSecondsToLoss(*challenger.curve, from, to);
  const double t_best = PredictedSecondsToLoss(*best.curve, from, to);
  if (!std::isfinite(t_challenger)) return false;
  if (!std::isfinite(t_best)) return true;
  return t_challenger < t_best * (1 - options_.min_improvement);
}

void AdspSearch::Next(const Scored& scored, Duration now) {
  auto with_commits = [&](uint32_t commits) {
    AdspSetting setting = best_->setting;
    setting.commits_per_period = commits;
    return setting;
  };
  auto start_momentum = [&] {
    momenta_left_.clear();
    for (double mu : options_.momentum_grid) {
      if (!best_->setting.momentum || mu != *best_->setting.momentum) {
        momenta_left_.push_back(mu);
      }
    }
    phase_ = Phase::kMomentum;
    if (!NextMomentum(now)) EndSearch(now);
  };
  switch (phase_) {
    case Phase::kSteady:
      return;
    case Phase::kBase: {
      if (!scored.curve) return EndSearch(now);  // keep the current setting
      best_ = scored;
      const uint32_t c = best_->setting.commits_per_period;
      if (c + 1 <= options_.max_commits) {
        phase_ = Phase::kUp;
        BeginCandidate(with_commits(c + 1), now);
      } else if (c > options_.min_commits) {
        phase_ = Phase::kDown;
        BeginCandidate(with_commits(c - 1), now);
      } else {
        start_momentum();
      }
      return;
    }
    case Phase::kUp: {
      if (Better(scored, *best_)) {
        best_ = scored;
        moved_up_ = true;
        const uint32_t c = best_->setting.commits_per_period;
        if (c + 1 <= options_.max_commits) {
          BeginCandidate(with_commits(c + 1), now);
          return;
        }
      } else if (!moved_up_ &&
                 best_->setting.commits_per_period > options_.min_commits) {
        phase_ = Phase::kDown;
        BeginCandidate(with_commits(best_->setting.commits_per_period - 1),
                       now);
        return;
      }
      start_momentum();
      return;
    }
    case Phase::kDown: {
      if (Better(scored, *best_)) {
        best_ = scored;
        const uint32_t c = best_->setting.commits_per_period;
        if (c > options_.min_commits) {
          BeginCandidate(with_commits(c - 1), now);
          return;
        }
      }
      start_momentum();
      return;
    }
    case Phase::kMomentum:
      if (Better(scored, *best_)) best_ = scored;
      if (!NextMomentum(now)) EndSearch(now);
      return;
  }
}

bool AdspSearch::NextMomentum(Duration now) {
  if (momenta_left_.empty()) return false;
  AdspSetting setting = best_->setting;
  setting.momentum = momenta_left_.front();
  momenta_left_.erase(momenta_left_.begin());
  BeginCandidate(setting, now);
  return true;
}

void AdspSearch::EndSearch(Duration now) {
  if (best_) setting_ = best_->setting;
  // Otherwise setting_ is the base candidate's: the setting before the
  // search.
  if (!candidate_.samples.empty()) {
    last_checkpoint_loss_ = candidate_.samples.back().loss;
  }
  phase_ = Phase::kSteady;
  search_time_s_ += ToSeconds(now - search_start_);
  last_search_end_ = now;
  next_checkpoint_ = now + FromSeconds(options_.period_s);
  checkpoint_pending_ = false;
  best_.reset();
  momenta_left_.clear();
}

double AdspSearch::search_time_s() const {
  double total = search_time_s_;
  if (phase_ != Phase::kSteady && last_advance_ > search_start_) {
    total += ToSeconds(last_advance_ - search_start_);
  }
  return total;
}

// ---------------------------------------------------------------------------
// ADACOMM.

uint32_t AdacommTau(double loss, double initial_loss, uint32_t tau0) {
  const uint32_t cap = std::max<uint32_t>(tau0, 1);
  if (!std::isfinite(loss) || !std::isfinite(initial_loss) ||
      !(initial_loss > 0)) {
    return cap;
  }
  if (!(loss > 0)) return 1;
  const double tau = std::ceil(std::sqrt(loss / initial_loss) * cap);
  if (!std::isfinite(tau) || tau >= cap) return cap;
  return std::max<uint32_t>(static_cast<uint32_t>(tau), 1);
}

Result<uint32_t> ChooseAdacommTau0(std::span<const Tau0Trial> trials) {
  std::optional<uint32_t> best;
  double best_rate = 0;
  for (const Tau0Trial& trial : trials) {
    if (trial.tau == 0 || !(trial.seconds > 0) ||
        !std::isfinite(trial.seconds) || !std::isfinite(trial.loss_before) ||
        !std::isfinite(trial.loss_after)) {
      continue;
    }
    const double rate = (trial.loss_before - trial.loss_after) / trial.seconds;
    if (!(rate > 0)) continue;
    if (!best || rate > best_rate || (rate == best_rate && trial.tau < *best)) {
      best = trial.tau;
      best_rate = rate;
    }
  }
  if (!best) {
    return InvalidArgumentError(
        "no tau0 trial lowered the loss in a positive, finite time");
  }
  return *best;
}

}  // namespace meridian
