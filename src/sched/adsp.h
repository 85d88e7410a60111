// ADSP's and ADACOMM's tuning as pure code: the commit-interval rule, the
// commit-overhead estimate, the loss-curve fit l(t) = 1/(a^2 t + b) + c and
// its score, the online search over the commit rate dC and the server
// momentum mu, and ADACOMM's period rules. Spec: ../shared/reference/adsp.md.
// Nothing here reads a clock or does I/O: callers pass the time in, so every
// piece runs on virtual time in tests.
#ifndef MERIDIAN_SCHED_ADSP_H_
#define MERIDIAN_SCHED_ADSP_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "meridian/core/clock.h"
#include "meridian/core/status.h"

namespace meridian {

// ---------------------------------------------------------------------------
// Commit interval.

// Seconds worker i waits between receiving a reply and committing again so
// that it makes `commits_per_period` commits per `period_s`:
// max(min_interval_s, period_s / commits_per_period - overhead_s), where
// `overhead_s` is the rest of its commit cycle (push, pull, load and the
// overshoot of its last step). Never negative or NaN: a non-finite or
// negative overhead counts as 0, 0 commits as 1, and a non-finite result
// falls back to `min_interval_s` (itself clamped to >= 0).
double AdspCommitInterval(double period_s, uint32_t commits_per_period,
                          double overhead_s, double min_interval_s);

// The link floor of a worker's commit interval: the shortest interval at
// which its commit round trip `round_trip_s` takes at most `max_fraction`
// of its commit cycle, round_trip_s * (1 - max_fraction) / max_fraction,
// capped at `period_s` (a worker on the slowest link still commits once
// per check period). 0 when max_fraction is not in (0, 1) or the round trip
// is not a positive finite number (not measured yet).
double AdspLinkFloor(double round_trip_s, double max_fraction,
                     double period_s);

// A worker's commit overhead o_i smoothed over several commits (an EWMA),
// so that one slow round trip does not skew its interval. Samples that are
// not finite are ignored and negative ones count as 0. Not thread-safe.
class CommitOverheadEstimate {
 public:
  // Each new sample moves the estimate by a quarter of its distance: about
  // the last 4-8 commits count, and one outlier moves it by a quarter.
  CommitOverheadEstimate() = default;
  // `weight` in (0, 1] (others count as 1): how much one sample moves it.
  explicit CommitOverheadEstimate(double weight)
      : weight_(weight > 0 && weight <= 1 ? weight : 1) {}

  void Add(double sample_s);
  // 0 until the first sample.
  double value_s() const { return value_s_; }
  uint64_t samples() const { return samples_; }

 private:
  double weight_ = 0.25;
  double value_s_ = 0;
  uint64_t samples_ = 0;
};

// ---------------------------------------------------------------------------
// Loss curve.

// One global loss evaluation: `t_s` seconds after the candidate started.
struct LossSample {
  double t_s = 0;
  double loss = 0;
};

// l(t) = 1 / (a2 * t + b) + c with a2 = a^2 > 0 and b > 0: a loss that
// falls from 1/b + c at t = 0 towards the plateau c.
struct LossCurve {
  double a2 = 0;
  double b = 0;
  double c = 0;
  double rms_residual = 0;  // of the fit, in loss units

  double At(double t_s) const { return 1.0 / (a2 * t_s + b) + c; }
};

// Least-squares fit of a LossCurve to `samples` (at least 3 finite ones at
// 3 distinct times). Errors (FailedPrecondition, never NaN, never a crash)
// for degenerate data the search must not act on: too few points, a flat
// loss (range below 0.1% of its size), a loss that does not fall (least-
// squares slope >= 0), or a fit whose RMS residual exceeds a quarter of the
// loss range (noise, not a curve). Method: for each plateau candidate c
// below min(loss), 1/(l - c) = a2 t + b is linear; a weighted linear fit
// (weights (l - c)^4, the first-order loss-space error) gives a2 and b, and
// c is chosen by a log-spaced scan refined by golden-section search on the
// loss-space residual. With 3 points the fit is exact, as in the authors'
// curve_fit.
Result<LossCurve> FitLossCurve(std::span<const LossSample> samples);

// Predicted seconds for `curve` to fall from `from_loss` to `to_loss`:
// (1/(to - c) - 1/(from - c)) / a2. +infinity when it never gets there
// (to_loss <= c, or to_loss >= from_loss, or inputs not finite). The curve
// may be extrapolated backwards (from_loss above l(0)): that is how two
// candidates measured one after the other are compared over one loss band.
double PredictedSecondsToLoss(const LossCurve& curve, double from_loss,
                              double to_loss);

// ---------------------------------------------------------------------------
// The online search.

struct AdspSearchOptions {
  double period_s = 10;           // Gamma
  uint32_t initial_commits = 10;  // dC to start from
  uint32_t min_commits = 1;       // bounds of dC
  uint32_t max_commits = 100;
  // Momenta to try after dC; empty: mu is not searched (momentum() is
  // nullopt).
  std::vector<double> momentum_grid;
  // Seconds from the end of a search to the next; 0: never periodically.
  double search_period_s = 300;
  double loss_jump_ratio = 0.3;     // relative rise that forces a search
  uint32_t samples_per_period = 5;  // >= 3; evaluations per candidate
  double min_improvement = 0.05;    // in [0, 1)
  bool enabled = true;              // false: never search
};

// The setting the search currently asks for.
struct AdspSetting {
  uint32_t commits_per_period = 1;  // dC
  std::optional<double> momentum;   // nullopt: the server's own momentum
};

// The online search for dC (hill-climbing up and down) and then mu (over
// its grid). Each candidate runs for one check period while training goes
// on (nobody is stopped); the global loss is evaluated at
// samples_per_period evenly spaced points of that period, a LossCurve is
// fitted, and two candidates are compared by their predicted time to cross
// the same loss band: from the higher of their start losses to the lower of
// their end losses. A candidate whose fit is degenerate never wins; if the
// current setting's own fit is degenerate, the search ends keeping it.
//
// Between searches one loss evaluation is asked for per check period (a
// checkpoint); a checkpoint at least loss_jump_ratio above the previous one,
// or search_period_s after the last search ended, starts a new search.
//
// Driven by one thread (the site server's event loop); not thread-safe.
class AdspSearch {
 public:
  explicit AdspSearch(AdspSearchOptions options);

  // Training starts at `now`; the first search starts with it (if enabled).
  void Start(Duration now);
  // Advances the search in time. Returns true when a global loss evaluation
  // of the current model is wanted now; the caller evaluates and reports it
  // with OnLossEvaluation (results may come late, out of time order, or not
  // at all: a candidate whose last sample is missing is scored at
  // `period_s / 2` past its end with what it has).
  bool Advance(Duration now);
  // The global loss of the model as it was at `taken_at`. Non-finite losses
  // are ignored.
  void OnLossEvaluation(double loss, Duration taken_at);

  const AdspSetting& setting() const { return setting_; }
  bool searching() const { return phase_ != Phase::kSteady; }
  // Seconds spent searching so far, including an unfinished search up to
  // the last Advance().
  double search_time_s() const;
  uint64_t searches_started() const { return searches_started_; }
  uint64_t candidates_scored() const { return candidates_scored_; }

 private:
  enum class Phase { kSteady, kBase, kUp, kDown, kMomentum };

  struct Candidate {
    AdspSetting setting;
    Duration start{0};
    std::vector<LossSample> samples;  // t_s relative to `start`
    uint32_t requested = 0;           // evaluations asked for so far
  };

  struct Scored {
    AdspSetting setting;
    std::optional<LossCurve> curve;  // nullopt: degenerate
    double start_loss = 0;           // first / last sample
    double end_loss = 0;
  };

  void BeginSearch(Duration now);
  void BeginCandidate(const AdspSetting& setting, Duration now);
  void FinishCandidate(Duration now);
  bool Better(const Scored& challenger, const Scored& best) const;
  // Picks the next candidate after the one just scored, or ends the search.
  void Next(const Scored& scored, Duration now);
  bool NextMomentum(Duration now);
  void EndSearch(Duration now);
  void OnCheckpoint(double loss, Duration now);

  AdspSearchOptions options_;
  AdspSetting setting_;
  Phase phase_ = Phase::kSteady;
  Candidate candidate_;
  std::optional<Scored> best_;
  bool moved_up_ = false;
  std::vector<double> momenta_left_;

  Duration last_advance_{0};
  Duration search_start_{0};
  Duration last_search_end_{0};
  double search_time_s_ = 0;  // of finished searches
  uint64_t searches_started_ = 0;
  uint64_t candidates_scored_ = 0;
  bool force_search_ = false;

  // Checkpoints between searches.
  Duration next_checkpoint_{0};
  bool checkpoint_pending_ = false;
  Duration checkpoint_requested_at_{0};
  std::optional<double> last_checkpoint_loss_;
};

// ---------------------------------------------------------------------------
// ADACOMM.

// ADACOMM's period for a global loss `loss` when the first one was
// `initial_loss`: ceil(sqrt(loss / initial_loss) * tau0), in [1, tau0]
// (capped at tau0: a rising loss does not earn longer local runs). Returns
// tau0 when the ratio is undefined (non-finite inputs or initial_loss <= 0)
// and 1 when loss <= 0 < initial_loss. tau0 = 0 counts as 1.
uint32_t AdacommTau(double loss, double initial_loss, uint32_t tau0);

// One offline trial of ADACOMM's tau0 search: the model is trained for
// `seconds` from a saved state with period `tau`, then restored.
struct Tau0Trial {
  uint32_t tau = 1;
  double loss_before = 0;
  double loss_after = 0;
  double seconds = 0;
};

// The tau of the trial with the fastest loss decrease (loss_before -
// loss_after) / seconds; ties go to the smaller tau. Trials with tau 0,
// non-positive seconds or non-finite losses are skipped; InvalidArgument
// when none is usable or no trial lowered the loss.
Result<uint32_t> ChooseAdacommTau0(std::span<const Tau0Trial> trials);

}  // namespace meridian

#endif  // MERIDIAN_SCHED_ADSP_H_
