#include "meridian/sched/policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "sched/adsp.h"

namespace meridian {
namespace {

pb::CommitPlan StepPlan(uint32_t local_steps) {
  pb::CommitPlan plan;
  plan.set_local_steps(local_steps);
  plan.set_interval_s(0);
  return plan;
}

// The live worker set and the clock of the policies without rounds (ASYNC,
// ADSP): the clock ticks each time the commits since the last tick reach
// the number of live workers (at least one), so a site whose workers die
// keeps its clock pace per live worker, and it never decreases. Sized by
// the site's worker count (fixed).
class CommitClock {
 public:
  void Start(uint32_t num_workers) {
    live_.assign(num_workers, true);
    live_count_ = num_workers;
  }
  // Marks `worker` live or not; false when that changed nothing (or the
  // worker is out of range).
  bool SetLive(uint32_t worker, bool live) {
    if (worker >= live_.size() || live_[worker] == live) return false;
    live_[worker] = live;
    if (live) {
      ++live_count_;
    } else {
      --live_count_;
    }
    return true;
  }
  void OnCommit() {
    if (++since_tick_ >= std::max<uint32_t>(live_count_, 1)) {
      ++clock_;
      since_tick_ = 0;
    }
  }
  uint64_t clock() const { return clock_; }

 private:
  std::vector<bool> live_;
  uint32_t live_count_ = 0;
  uint64_t since_tick_ = 0;  // commits since the last tick
  uint64_t clock_ = 0;
};

// Bulk synchronous: every worker commits once per clock; the commits of a
// clock are summed and applied together, and nobody gets the model back
// until every live worker has committed that clock. A worker that leaves or
// dies stops counting (its commit of the open round, if any, is applied
// with the round); a joiner waits for the open round to close and counts
// from the next one, so every worker of a round starts from the same model.
// With local_steps = tau this is FIXED_ADACOMM (local SGD with periodic
// averaging: the store's MEAN rule averages the round's sum).
class BspPolicy : public IntraSitePolicy {
 public:
  explicit BspPolicy(uint32_t local_steps, std::string_view name = "bsp")
      : local_steps_(local_steps), name_(name) {}

  std::string_view name() const override { return name_; }

  void Start(uint32_t num_workers, Duration /*now*/) override {
    committed_.assign(num_workers, false);
    active_.assign(num_workers, true);
    joining_.assign(num_workers, false);
  }

  PolicyDecision OnCommit(const CommitEvent& event) override {
    PolicyDecision decision;
    if (event.worker >= committed_.size() || !active_[event.worker]) {
      decision.update = PolicyDecision::Update::kReject;
      decision.reject_reason = "worker is not part of this barrier";
      return decision;
    }
    if (committed_[event.worker]) {
      decision.update = PolicyDecision::Update::kReject;
      decision.reject_reason =
          "second commit in clock " + std::to_string(clock_);
      return decision;
    }
    decision.update = PolicyDecision::Update::kAggregate;
    committed_[event.worker] = true;
    MaybeCloseClock(&decision);
    return decision;
  }

  PolicyDecision OnPull(uint32_t worker, Duration /*now*/) override {
    PolicyDecision decision;
    decision.release.push_back(worker);
    return decision;
  }

  PolicyDecision OnLeave(uint32_t worker, Duration /*now*/) override {
    PolicyDecision decision;
    if (worker < active_.size()) {
      active_[worker] = false;
      joining_[worker] = false;
      // A departed worker's pending commit (if any) stays in the aggregate:
      // it was accepted and is applied with the rest of its clock.
      MaybeCloseClock(&decision);
    }
    return decision;
  }

  PolicyDecision OnJoin(uint32_t worker, Duration /*now*/) override {
    PolicyDecision decision;
    if (worker >= active_.size() || active_[worker] || joining_[worker]) {
      return decision;
    }
    joining_[worker] = true;
    // Released at once when no live worker is still computing the open
    // round (e.g. it is the only one left), else at the round's close.
    MaybeCloseClock(&decision);
    return decision;
  }

  pb::CommitPlan PlanFor(uint32_t /*worker*/) const override {
    return StepPlan(local_steps_);
  }

  uint64_t clock() const override { return clock_; }

 protected:
  // Called when a round closes, before the released workers' plans are
  // taken: a subclass may change local_steps_ here so that every worker of
  // the next round gets the same plan.
  virtual void OnRoundClosed() {}

  uint32_t local_steps_;

 private:
  // Closes the open round once every live worker has committed to it (a
  // round without any commit does not tick), then lets the joiners in.
  void MaybeCloseClock(PolicyDecision* decision) {
    bool any_committed = false;
    for (size_t w = 0; w < committed_.size(); ++w) {
      if (active_[w] && !committed_[w]) return;  // still waiting for w
      any_committed = any_committed || committed_[w];
    }
    if (any_committed) {
      decision->flush_aggregate = true;
      for (size_t w = 0; w < committed_.size(); ++w) {
        if (committed_[w] && active_[w]) {
          decision->release.push_back(static_cast<uint32_t>(w));
        }
      }
      std::fill(committed_.begin(), committed_.end(), false);
      ++clock_;
      OnRoundClosed();
    }
    for (size_t w = 0; w < joining_.size(); ++w) {
      if (!joining_[w]) continue;
      joining_[w] = false;
      active_[w] = true;
      decision->release.push_back(static_cast<uint32_t>(w));
    }
  }

  std::string_view name_;
  std::vector<bool> committed_;  // committed in the current clock
  std::vector<bool> active_;     // live: the barrier waits for it
  std::vector<bool> joining_;    // joined; active from the next round
  uint64_t clock_ = 0;
};

// ADACOMM: BSP rounds of tau local steps, with tau re-adapted once per check
// period to ceil(sqrt(L / L0) * tau0) from the global loss (AdacommTau). A
// new tau takes effect when the current round closes, so the workers of one
// round always run the same number of steps.
class AdacommPolicy final : public BspPolicy {
 public:
  AdacommPolicy(uint32_t tau0, double check_period_s)
      : BspPolicy(tau0, "adacomm"),
        tau0_(tau0),
        next_tau_(tau0),
        period_(FromSeconds(check_period_s)) {}

  void Start(uint32_t num_workers, Duration now) override {
    BspPolicy::Start(num_workers, now);
    next_evaluation_ = now;
  }

  // Asks for the global loss once per check period (the first one, at the
  // start, becomes L0).
  PolicyDecision OnTick(Duration now) override {
    PolicyDecision decision;
    if (now >= next_evaluation_) {
      decision.evaluate_loss = true;
      next_evaluation_ = now + period_;
    }
    return decision;
  }

  void OnLossEvaluation(double loss, Duration /*taken_at*/) override {
    if (!std::isfinite(loss)) return;
    if (!initial_loss_) initial_loss_ = loss;
    next_tau_ = AdacommTau(loss, *initial_loss_, tau0_);
  }

 protected:
  void OnRoundClosed() override { local_steps_ = next_tau_; }

 private:
  uint32_t tau0_;
  uint32_t next_tau_;
  Duration period_;
  Duration next_evaluation_{0};
  std::optional<double> initial_loss_;
};

// Stale synchronous parallel: every commit is applied at once; a worker's
// clock is its number of accepted commits, and a worker more than
// `staleness` clocks ahead of the slowest live worker is not answered
// (commit or pull) until the slowest has caught up to within `staleness`.
// A joiner starts at the slowest live worker's clock.
class SspPolicy final : public IntraSitePolicy {
 public:
  SspPolicy(uint32_t local_steps, uint32_t staleness)
      : local_steps_(local_steps), staleness_(staleness) {}

  std::string_view name() const override { return "ssp"; }

  void Start(uint32_t num_workers, Duration /*now*/) override {
    clocks_.assign(num_workers, 0);
    active_.assign(num_workers, true);
    held_.assign(num_workers, false);
  }

  PolicyDecision OnCommit(const CommitEvent& event) override {
    PolicyDecision decision;
    if (event.worker >= clocks_.size() || !active_[event.worker]) {
      decision.update = PolicyDecision::Update::kReject;
      decision.reject_reason = "worker is not part of this site's SSP clocks";
      return decision;
    }
    decision.update = PolicyDecision::Update::kApply;
    ++clocks_[event.worker];
    held_[event.worker] = true;
    ReleaseCaughtUp(&decision);
    return decision;
  }

  PolicyDecision OnPull(uint32_t worker, Duration /*now*/) override {
    PolicyDecision decision;
    if (worker >= clocks_.size()) return decision;
    held_[worker] = true;
    ReleaseCaughtUp(&decision);
    return decision;
  }

  PolicyDecision OnLeave(uint32_t worker, Duration /*now*/) override {
    PolicyDecision decision;
    if (worker < active_.size()) {
      active_[worker] = false;
      held_[worker] = false;
      ReleaseCaughtUp(&decision);
    }
    return decision;
  }

  PolicyDecision OnJoin(uint32_t worker, Duration /*now*/) override {
    PolicyDecision decision;
    if (worker >= active_.size() || active_[worker]) return decision;
    uint64_t slowest = std::numeric_limits<uint64_t>::max();
    for (size_t w = 0; w < clocks_.size(); ++w) {
      if (active_[w]) slowest = std::min(slowest, clocks_[w]);
    }
    clocks_[worker] =
        slowest == std::numeric_limits<uint64_t>::max() ? min_clock_ : slowest;
    active_[worker] = true;
    held_[worker] = true;  // its HELLO waits for the answer
    ReleaseCaughtUp(&decision);
    return decision;
  }

  pb::CommitPlan PlanFor(uint32_t /*worker*/) const override {
    return StepPlan(local_steps_);
  }

  // The slowest live worker's clock (never decreases: workers only leave
  // the minimum, and a joiner starts at it).
  uint64_t clock() const override { return min_clock_; }

 private:
  void ReleaseCaughtUp(PolicyDecision* decision) {
    uint64_t min_clock = std::numeric_limits<uint64_t>::max();
    for (size_t w = 0; w < clocks_.size(); ++w) {
      if (active_[w]) min_clock = std::min(min_clock, clocks_[w]);
    }
    if (min_clock == std::numeric_limits<uint64_t>::max()) return;
    min_clock_ = std::max(min_clock_, min_clock);
    for (size_t w = 0; w < clocks_.size(); ++w) {
      if (held_[w] && active_[w] && clocks_[w] - min_clock <= staleness_) {
        held_[w] = false;
        decision->release.push_back(static_cast<uint32_t>(w));
      }
    }
  }

  uint32_t local_steps_;
  uint32_t staleness_;
  std::vector<uint64_t> clocks_;  // accepted commits per worker
  std::vector<bool> active_;      // still in the job
  std::vector<bool> held_;        // has an unanswered commit or pull
  uint64_t min_clock_ = 0;
};

// ADSP: nobody waits. Every commit is applied and answered at once; the
// plan tells worker i to commit every
// max(T_min, F_i, Gamma / dC - o_i) seconds (AdspCommitInterval), where
// F_i is its link floor (AdspLinkFloor of the round trip it reports with
// each commit) and o_i is
// the rest of its commit cycle, measured as the gap between its commit's
// arrival and the previous reply minus the interval that reply carried
// (push, pull, load and the overshoot of its last step), smoothed by an
// EWMA. dC and the server momentum come from the online AdspSearch.
class AdspPolicy final : public IntraSitePolicy {
 public:
  explicit AdspPolicy(const pb::PolicyConfig& config)
      : period_s_(config.check_period_s()),
        min_interval_s_(config.min_commit_interval_s()),
        max_overhead_fraction_(config.max_commit_overhead_fraction()),
        search_(OptionsFrom(config)) {}

  std::string_view name() const override { return "adsp"; }

  void Start(uint32_t num_workers, Duration now) override {
    clock_.Start(num_workers);
    workers_.assign(num_workers, WorkerState{});
    search_.Start(now);
    for (uint32_t w = 0; w < num_workers; ++w) {
      workers_[w].last_reply = now;
      workers_[w].interval_s = Interval(w);
    }
  }

  PolicyDecision OnCommit(const CommitEvent& event) override {
    PolicyDecision decision;
    if (event.worker >= workers_.size()) {
      decision.update = PolicyDecision::Update::kReject;
      decision.reject_reason = "worker is not part of this site";
      return decision;
    }
    WorkerState& state = workers_[event.worker];
    const double cycle_target =
        period_s_ / std::max<uint32_t>(search_.setting().commits_per_period, 1);
    if (state.replied_after_commit) {
      // The cycle beyond the planned interval, bounded by the target cycle:
      // a longer one (a stall) says nothing more about the overhead.
      const double measured =
          ToSeconds(event.now - state.last_reply) - state.interval_s;
      state.overhead.Add(std::min(measured, cycle_target));
    } else if (event.commit_overhead_s > 0) {
      // The first cycle also holds the join; trust the worker's own report.
      state.overhead.Add(std::min(event.commit_overhead_s, cycle_target));
    }
    // The worker's own measure of its link (already smoothed): a hostile
    // value only slows its own commits, and the floor is capped at Gamma.
    state.link_floor_s = AdspLinkFloor(event.commit_overhead_s,
                                       max_overhead_fraction_, period_s_);
    clock_.OnCommit();
    decision.update = PolicyDecision::Update::kApply;
    decision.release.push_back(event.worker);
    state.last_reply = event.now;
    state.replied_after_commit = true;
    state.interval_s = Interval(event.worker);
    return decision;
  }

  PolicyDecision OnPull(uint32_t worker, Duration now) override {
    PolicyDecision decision;
    decision.release.push_back(worker);
    if (worker < workers_.size()) {
      // The reply restarts the worker's interval.
      workers_[worker].last_reply = now;
      workers_[worker].interval_s = Interval(worker);
    }
    return decision;
  }

  PolicyDecision OnLeave(uint32_t worker, Duration /*now*/) override {
    clock_.SetLive(worker, false);
    return {};
  }

  // A joiner's cycle starts with its WELCOME; the overhead estimate of the
  // slot (the same device, as a rule) is kept.
  PolicyDecision OnJoin(uint32_t worker, Duration now) override {
    PolicyDecision decision;
    if (!clock_.SetLive(worker, true)) return decision;
    WorkerState& state = workers_[worker];
    state.last_reply = now;
    state.replied_after_commit = false;
    state.interval_s = Interval(worker);
    decision.release.push_back(worker);
    return decision;
  }

  PolicyDecision OnTick(Duration now) override {
    PolicyDecision decision;
    decision.evaluate_loss = search_.Advance(now);
    return decision;
  }

  void OnLossEvaluation(double loss, Duration taken_at) override {
    search_.OnLossEvaluation(loss, taken_at);
  }

  pb::CommitPlan PlanFor(uint32_t worker) const override {
    pb::CommitPlan plan;
    plan.set_local_steps(0);
    plan.set_interval_s(Interval(worker));
    return plan;
  }

  std::optional<double> ServerMomentum() const override {
    return search_.setting().momentum;
  }

  double search_time_s() const override { return search_.search_time_s(); }

  uint64_t clock() const override { return clock_.clock(); }

 private:
  struct WorkerState {
    CommitOverheadEstimate overhead;
    Duration last_reply{0};
    double interval_s = 0;  // carried by the last reply
    double link_floor_s = 0;
    bool replied_after_commit = false;
  };

  static AdspSearchOptions OptionsFrom(const pb::PolicyConfig& config) {
    AdspSearchOptions options;
    options.period_s = config.check_period_s();
    options.initial_commits = config.initial_commits_per_period();
    options.min_commits = config.min_commits_per_period();
    uint32_t max_commits = config.max_commits_per_period();
    if (max_commits == 0) {
      const double by_floor = config.min_commit_interval_s() > 0
                                  ? std::floor(config.check_period_s() /
                                               config.min_commit_interval_s())
                                  : 1e6;
      max_commits = static_cast<uint32_t>(std::clamp(by_floor, 1.0, 1e6));
    }
    options.max_commits = max_commits;
    // Without a search the configured server momentum stays in charge.
    if (config.search() && config.search_momentum()) {
      options.momentum_grid.assign(config.momentum_grid().begin(),
                                   config.momentum_grid().end());
      if (options.momentum_grid.empty()) options.momentum_grid = {0, 0.3, 0.6};
    }
    options.search_period_s = config.search_period_s();
    options.loss_jump_ratio = config.loss_jump_ratio();
    options.samples_per_period = config.search_samples_per_period();
    options.min_improvement = config.search_min_improvement();
    options.enabled = config.search();
    return options;
  }

  double Interval(uint32_t worker) const {
    const WorkerState state =
        worker < workers_.size() ? workers_[worker] : WorkerState{};
    return AdspCommitInterval(period_s_, search_.setting().commits_per_period,
                              state.overhead.value_s(),
                              std::max(min_interval_s_, state.link_floor_s));
  }

  double period_s_;
  double min_interval_s_;
  double max_overhead_fraction_;
  AdspSearch search_;
  CommitClock clock_;
  std::vector<WorkerState> workers_;
};

// Fully asynchronous (TAP): every commit is applied and answered at once;
// a joiner is answered at once.
class AsyncPolicy final : public IntraSitePolicy {
 public:
  explicit AsyncPolicy(uint32_t local_steps) : local_steps_(local_steps) {}

  std::string_view name() const override { return "async"; }

  void Start(uint32_t num_workers, Duration /*now*/) override {
    clock_.Start(num_workers);
  }

  PolicyDecision OnCommit(const CommitEvent& event) override {
    clock_.OnCommit();
    PolicyDecision decision;
    decision.release.push_back(event.worker);
    return decision;
  }

  PolicyDecision OnPull(uint32_t worker, Duration /*now*/) override {
    PolicyDecision decision;
    decision.release.push_back(worker);
    return decision;
  }

  PolicyDecision OnLeave(uint32_t worker, Duration /*now*/) override {
    clock_.SetLive(worker, false);
    return {};
  }

  PolicyDecision OnJoin(uint32_t worker, Duration /*now*/) override {
    PolicyDecision decision;
    if (clock_.SetLive(worker, true)) decision.release.push_back(worker);
    return decision;
  }

  pb::CommitPlan PlanFor(uint32_t /*worker*/) const override {
    return StepPlan(local_steps_);
  }

  uint64_t clock() const override { return clock_.clock(); }

 private:
  uint32_t local_steps_;
  CommitClock clock_;
};

}  // namespace

Result<std::unique_ptr<IntraSitePolicy>> MakePolicy(
    const pb::PolicyConfig& config) {
  const uint32_t local_steps = std::max<uint32_t>(config.local_steps(), 1);
  switch (config.kind()) {
    case pb::BSP:
      return std::unique_ptr<IntraSitePolicy>(new BspPolicy(local_steps));
    case pb::ASYNC:  // TAP
      return std::unique_ptr<IntraSitePolicy>(new AsyncPolicy(local_steps));
    case pb::SSP:
      return std::unique_ptr<IntraSitePolicy>(
          new SspPolicy(local_steps, config.staleness()));
    case pb::FIXED_ADACOMM:
      return std::unique_ptr<IntraSitePolicy>(
          new BspPolicy(std::max<uint32_t>(config.tau(), 1), "fixed_adacomm"));
    case pb::ADACOMM:
      if (!(config.check_period_s() > 0)) break;
      return std::unique_ptr<IntraSitePolicy>(new AdacommPolicy(
          std::max<uint32_t>(config.tau0(), 1), config.check_period_s()));
    case pb::ADSP:
      if (!(config.check_period_s() > 0) ||
          !std::isfinite(config.check_period_s())) {
        break;
      }
      return std::unique_ptr<IntraSitePolicy>(new AdspPolicy(config));
    case pb::POLICY_KIND_UNSPECIFIED:
      break;
  }
  return InvalidArgumentError(
      "policy kind is not set or unknown, or its check_period_s is not "
      "positive");
}

}  // namespace meridian
