// Intra-site scheduling: the one place that decides when a worker commits
// (the plan it is sent) and when a commit or pull is answered. The policies
// (pb::PolicyKind): BSP; ASYNC, which is TAP; SSP; FIXED_ADACOMM; ADACOMM;
// and ADSP, whose tuning math lives in src/sched/adsp.h.
//
// Driving a policy (the site server's event loop):
//   - Start() once, when training starts (every worker joined, or the join
//     timeout passed with fault.min_workers): every worker counts as live;
//     then OnLeave() for each worker that has not joined.
//   - OnCommit/OnPull per request; OnLeave when a worker says BYE or is
//     declared dead; OnJoin when a worker that is not live joins (late, or
//     back after it was declared dead, or restarted); OnTick() every few
//     milliseconds.
//   - Execute every PolicyDecision: handle the update, flush the aggregate
//     if asked, answer the released workers with PlanFor(worker) attached.
//   - When a decision has evaluate_loss set, evaluate the global loss of a
//     snapshot of the model as it is now (ADSP: the mean loss over
//     PolicyConfig.loss_eval_batches fixed minibatches of training data;
//     ADACOMM: the same, or the test loss) and report it with
//     OnLossEvaluation(loss, snapshot time), on the event thread. Late,
//     coalesced or missing reports are tolerated.
//   - After every decision, apply ServerMomentum() to the store when it has
//     a value (ADSP's momentum search changes it between candidates).
#ifndef MERIDIAN_SCHED_POLICY_H_
#define MERIDIAN_SCHED_POLICY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meridian/core/clock.h"
#include "meridian/job.pb.h"
#include "meridian/core/status.h"
#include "meridian/wire.pb.h"

namespace meridian {

// A commit that passed validation, as the policy sees it.
struct CommitEvent {
  uint32_t worker = 0;
  uint64_t base_version = 0;     // model version the update started from
  uint64_t current_version = 0;  // server's version on arrival
  uint32_t local_steps = 0;      // steps folded into the update
  Duration now{0};
  // The worker's own smoothed commit round trip in seconds
  // (pb::WorkerStats.commit_overhead_s of the commit); 0: not reported.
  double commit_overhead_s = 0;
};

// What the site server does in response to an event, in this order:
// handle the commit's update, apply the aggregate if asked, then answer the
// released workers' outstanding requests with the resulting model.
struct PolicyDecision {
  enum class Update {
    kApply,      // apply this commit on its own now
    kAggregate,  // add it to the barrier aggregate
    kReject,     // refuse it (ERROR_STALE with reject_reason)
  };
  Update update = Update::kApply;
  std::string reject_reason;
  bool flush_aggregate = false;
  std::vector<uint32_t> release;
  // Evaluate the global loss of the model as it is now and report it with
  // IntraSitePolicy::OnLossEvaluation (see the top of this file).
  bool evaluate_loss = false;
};

// Driven by the site server's single event thread: not thread-safe.
// Workers are numbered 0..num_workers-1 within the site.
class IntraSitePolicy {
 public:
  virtual ~IntraSitePolicy() = default;

  virtual std::string_view name() const = 0;
  // Every worker has joined; training starts at `now`.
  virtual void Start(uint32_t num_workers, Duration now) = 0;
  virtual PolicyDecision OnCommit(const CommitEvent& event) = 0;
  // `worker` asks for the model without an update.
  virtual PolicyDecision OnPull(uint32_t worker, Duration now) = 0;
  // `worker` left (BYE) or was lost: nobody waits for it any more. An
  // update it committed before is kept (an aggregated one is applied with
  // the rest of its round); it is not released.
  virtual PolicyDecision OnLeave(uint32_t worker, Duration now) = 0;
  // `worker` (re)joins while training runs: it was not live (never joined,
  // left, or declared dead) and its HELLO waits for an answer. Releasing it
  // answers that HELLO with the model (WELCOME). Barrier policies (BSP,
  // FIXED_ADACOMM, ADACOMM) release a joiner when the open round closes and
  // count it from the next round; SSP starts it at the slowest live
  // worker's clock; ASYNC and ADSP release it at once. Ignored for a worker
  // that is live already or out of range.
  virtual PolicyDecision OnJoin(uint32_t worker, Duration now) = 0;
  // Periodic call from the event loop (every few milliseconds) for
  // time-driven policies.
  virtual PolicyDecision OnTick(Duration now) {
    (void)now;
    return {};
  }
  // A global loss evaluation asked for with PolicyDecision::evaluate_loss:
  // `loss` of the model snapshot taken at `taken_at` (not the time the
  // result is ready). Non-finite losses are ignored. Default: ignored.
  virtual void OnLossEvaluation(double loss, Duration taken_at) {
    (void)loss;
    (void)taken_at;
  }
  // The plan sent with the next reply to `worker`.
  virtual pb::CommitPlan PlanFor(uint32_t worker) const = 0;
  // The server momentum mu (v = mu*v + eta*U; W += v) the policy wants now;
  // nullopt (the default): keep ServerConfig.momentum. In [0, 1).
  virtual std::optional<double> ServerMomentum() const { return std::nullopt; }
  // Seconds of training spent in online tuning (ADSP's search) so far; 0
  // for policies without one.
  virtual double search_time_s() const { return 0; }
  // The site's logical clock: rounds completed (BSP, FIXED_ADACOMM,
  // ADACOMM: barriers passed; SSP: the slowest live worker's commits;
  // ASYNC and ADSP: +1 each time the commits since the last tick reach the
  // number of live workers, i.e. commits / workers while nobody leaves or
  // joins). It follows the live worker set and never decreases.
  virtual uint64_t clock() const = 0;
};

// Builds the policy the config selects.
Result<std::unique_ptr<IntraSitePolicy>> MakePolicy(
    const pb::PolicyConfig& config);

// Worker side: follows the latest pb::CommitPlan and says when to commit.
// Not thread-safe.
class CommitTrigger {
 public:
  // A new plan arrived with a reply at `now`; counting restarts.
  void Reset(const pb::CommitPlan& plan, Duration now);
  // Records one local step finished at `now`; true when the plan says to
  // commit (the step count or the interval is reached, whichever first).
  bool OnStep(Duration now);
  uint32_t steps_since_commit() const { return steps_; }
  const pb::CommitPlan& plan() const { return plan_; }

 private:
  pb::CommitPlan plan_;
  Duration last_commit_{0};
  uint32_t steps_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_SCHED_POLICY_H_
