// Test-only: one site on virtual time. Workers with their own step time and
// commit transit times run the real worker-side CommitTrigger against a
// real IntraSitePolicy, event by event on a ManualClock, so a test can ask
// who waited for whom, for how long, and how many commits each made when.
// Workers can die (Kill) and join again (Join) between runs.
#ifndef MERIDIAN_TESTS_SCHED_VIRTUAL_SITE_H_
#define MERIDIAN_TESTS_SCHED_VIRTUAL_SITE_H_

#include <cstdint>
#include <functional>
#include <queue>
#include <tuple>
#include <vector>

#include "meridian/core/clock.h"
#include "meridian/sched/policy.h"

namespace meridian::testing_sched {

struct SimWorker {
  double step_s = 1;  // time of one local step
  double up_s = 0;    // commit transit worker -> server
  double down_s = 0;  // reply transit server -> worker
};

// One wait for the server beyond the transit times: [start_s, end_s).
struct Wait {
  double start_s = 0;
  double end_s = 0;
};

struct WorkerLog {
  uint64_t steps = 0;
  std::vector<double> commit_arrivals_s;  // at the server
  std::vector<uint32_t> commit_steps;     // local steps in each commit
  std::vector<Wait> waits;                // only waits longer than 1 ns
  double blocked_s = 0;
  uint64_t rejected = 0;
  // When a Join() was answered (the server released the joiner).
  std::vector<double> join_released_s;

  // Commits that arrived in [from_s, to_s).
  int CommitsIn(double from_s, double to_s) const {
    int n = 0;
    for (double t : commit_arrivals_s) n += (t >= from_s && t < to_s);
    return n;
  }
};

// Not thread-safe; the policy must outlive the site.
class VirtualSite {
 public:
  VirtualSite(IntraSitePolicy* policy, std::vector<SimWorker> workers,
              double tick_s = 0.01)
      : policy_(policy),
        workers_(std::move(workers)),
        tick_(FromSeconds(tick_s)),
        state_(workers_.size()),
        logs_(workers_.size()) {
    policy_->Start(static_cast<uint32_t>(workers_.size()), clock_.Now());
    for (uint32_t w = 0; w < workers_.size(); ++w) {
      state_[w].trigger.Reset(policy_->PlanFor(w), clock_.Now());
      Push(FromSeconds(workers_[w].step_s), kStepDone, w);
    }
    Push(Duration(0), kTick, 0);
  }

  // Global loss reported when the policy asks for one: f(now_s).
  void set_loss(std::function<double(double)> loss) { loss_ = std::move(loss); }
  // Called after every policy decision (e.g. to watch the momentum).
  void set_observer(std::function<void(double)> observer) {
    observer_ = std::move(observer);
  }

  void RunUntil(double t_s) {
    const Duration end = FromSeconds(t_s);
    while (!events_.empty() && std::get<0>(events_.top()) <= end) {
      const auto [at, seq, kind, w, generation] = events_.top();
      events_.pop();
      clock_.Advance(at - clock_.Now());
      Handle(kind, w, generation);
    }
    clock_.Advance(end - clock_.Now());
  }

  // Worker `w` dies now: whatever it was doing is lost, an update of its
  // that already arrived stays with the policy; the policy hears OnLeave.
  void Kill(uint32_t w) {
    ++state_[w].generation;
    state_[w].waiting = false;
    state_[w].alive = false;
    Execute(policy_->OnLeave(w, clock_.Now()));
  }

  // A new process for worker `w` joins now: it waits for the policy to
  // release it (its WELCOME), then trains from scratch.
  void Join(uint32_t w) {
    State& s = state_[w];
    ++s.generation;
    s.alive = true;
    s.waiting = true;
    s.joining = true;
    s.reply_scheduled = false;
    s.commit_sent = clock_.Now();
    Execute(policy_->OnJoin(w, clock_.Now()));
  }

  const std::vector<WorkerLog>& logs() const { return logs_; }
  double now_s() const { return clock_.NowSeconds(); }
  uint64_t evaluations() const { return evaluations_; }

 private:
  enum Kind { kStepDone, kCommitArrive, kReplyArrive, kTick };

  struct State {
    CommitTrigger trigger;
    bool waiting = false;
    bool reply_scheduled = false;
    Duration commit_sent{0};
    pb::CommitPlan plan;
    // Each Kill and Join starts a new generation: events of an earlier one
    // (a dead process's steps and replies) are dropped.
    uint32_t generation = 0;
    bool alive = true;
    bool joining = false;  // waiting for the answer to its join
    // Its last commit's round trip, reported with the next commit as a
    // worker reports its smoothed one; 0 before the first.
    double round_trip_s = 0;
  };

  // (time, sequence, kind, worker, generation)
  using Event = std::tuple<Duration, uint64_t, Kind, uint32_t, uint32_t>;

  void Push(Duration at, Kind kind, uint32_t worker) {
    const uint32_t generation = kind == kTick ? 0 : state_[worker].generation;
    events_.emplace(at, ++seq_, kind, worker, generation);
  }

  void Handle(Kind kind, uint32_t w, uint32_t generation) {
    const Duration now = clock_.Now();
    if (kind != kTick &&
        (generation != state_[w].generation || !state_[w].alive)) {
      return;  // the process this event belonged to is gone
    }
    switch (kind) {
      case kStepDone: {
        ++logs_[w].steps;
        if (state_[w].trigger.OnStep(now)) {
          state_[w].waiting = true;
          state_[w].reply_scheduled = false;
          state_[w].commit_sent = now;
          Push(now + FromSeconds(workers_[w].up_s), kCommitArrive, w);
        } else {
          Push(now + FromSeconds(workers_[w].step_s), kStepDone, w);
        }
        return;
      }
      case kCommitArrive: {
        CommitEvent event;
        event.worker = w;
        event.local_steps = state_[w].trigger.steps_since_commit();
        event.now = now;
        event.commit_overhead_s = state_[w].round_trip_s;
        logs_[w].commit_arrivals_s.push_back(ToSeconds(now));
        logs_[w].commit_steps.push_back(event.local_steps);
        const PolicyDecision decision = policy_->OnCommit(event);
        if (decision.update == PolicyDecision::Update::kReject) {
          ++logs_[w].rejected;
        }
        Execute(decision);
        return;
      }
      case kReplyArrive: {
        State& s = state_[w];
        if (s.joining) {
          s.joining = false;
          logs_[w].join_released_s.push_back(ToSeconds(now) -
                                             workers_[w].down_s);
          s.waiting = false;
          s.trigger.Reset(s.plan, now);
          Push(now + FromSeconds(workers_[w].step_s), kStepDone, w);
          return;
        }
        s.round_trip_s = ToSeconds(now - s.commit_sent);
        const double blocked = ToSeconds(now - s.commit_sent) -
                               workers_[w].up_s - workers_[w].down_s;
        if (blocked > 1e-9) {
          logs_[w].waits.push_back(
              Wait{ToSeconds(now) - workers_[w].down_s - blocked,
                   ToSeconds(now) - workers_[w].down_s});
          logs_[w].blocked_s += blocked;
        }
        s.waiting = false;
        s.trigger.Reset(s.plan, now);
        Push(now + FromSeconds(workers_[w].step_s), kStepDone, w);
        return;
      }
      case kTick:
        Execute(policy_->OnTick(now));
        Push(now + tick_, kTick, 0);
        return;
    }
  }

  void Execute(const PolicyDecision& decision) {
    const Duration now = clock_.Now();
    for (uint32_t r : decision.release) {
      if (r >= state_.size() || !state_[r].alive || !state_[r].waiting ||
          state_[r].reply_scheduled) {
        continue;
      }
      state_[r].reply_scheduled = true;
      state_[r].plan = policy_->PlanFor(r);
      Push(now + FromSeconds(workers_[r].down_s), kReplyArrive, r);
    }
    if (decision.evaluate_loss && loss_) {
      ++evaluations_;
      policy_->OnLossEvaluation(loss_(ToSeconds(now)), now);
    }
    if (observer_) observer_(ToSeconds(now));
  }

  IntraSitePolicy* policy_;
  std::vector<SimWorker> workers_;
  Duration tick_;
  ManualClock clock_;
  std::vector<State> state_;
  std::vector<WorkerLog> logs_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t seq_ = 0;
  uint64_t evaluations_ = 0;
  std::function<double(double)> loss_;
  std::function<void(double)> observer_;
};

}  // namespace meridian::testing_sched

#endif  // MERIDIAN_TESTS_SCHED_VIRTUAL_SITE_H_
