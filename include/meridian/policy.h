// Intra-site scheduling: the one place that decides when a worker commits
// (the plan it is sent) and when a commit or pull is answered. BSP and
// fully asynchronous training are policies here; ADSP, SSP and the ADACOMM
// baselines plug in behind the same interface.
#ifndef MERIDIAN_POLICY_H_
#define MERIDIAN_POLICY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "meridian/clock.h"
#include "meridian/meridian.pb.h"
#include "meridian/status.h"

namespace meridian {

// A commit that passed validation, as the policy sees it.
struct CommitEvent {
  uint32_t worker = 0;
  uint64_t base_version = 0;     // model version the update started from
  uint64_t current_version = 0;  // server's version on arrival
  uint32_t local_steps = 0;      // steps folded into the update
  Duration now{0};
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
  // `worker` left (BYE) or was lost: nobody waits for it any more.
  virtual PolicyDecision OnLeave(uint32_t worker, Duration now) = 0;
  // Periodic call from the event loop (every few milliseconds) for
  // time-driven policies.
  virtual PolicyDecision OnTick(Duration now) {
    (void)now;
    return {};
  }
  // The plan sent with the next reply to `worker`.
  virtual pb::CommitPlan PlanFor(uint32_t worker) const = 0;
  // The site's logical clock: rounds completed (BSP: barriers passed;
  // asynchronous: commits / workers, rounded down).
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

 private:
  pb::CommitPlan plan_;
  Duration last_commit_{0};
  uint32_t steps_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_POLICY_H_
