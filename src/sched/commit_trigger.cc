#include "meridian/sched/policy.h"

namespace meridian {

void CommitTrigger::Reset(const pb::CommitPlan& plan, Duration now) {
  plan_ = plan;
  last_commit_ = now;
  steps_ = 0;
}

bool CommitTrigger::OnStep(Duration now) {
  ++steps_;
  const bool by_steps =
      plan_.local_steps() > 0 && steps_ >= plan_.local_steps();
  const bool by_time = plan_.interval_s() > 0 &&
                       ToSeconds(now - last_commit_) >= plan_.interval_s();
  // A plan with neither trigger would never commit: commit every step.
  const bool no_trigger = plan_.local_steps() == 0 && plan_.interval_s() <= 0;
  return by_steps || by_time || no_trigger;
}

}  // namespace meridian
