#include "site/policy_driver.h"

#include <optional>

#include "meridian/core/log.h"

namespace meridian {

PolicyDriver::PolicyDriver(const SiteContext& site, IntraSitePolicy* policy,
                           ParameterStore* store, WorkerTable* workers,
                           Replies* replies, Evaluation* evaluator,
                           SiteClock* clock, const TrainingPhase* phase)
    : policy_(policy),
      store_(store),
      workers_(workers),
      replies_(replies),
      evaluator_(evaluator),
      clock_(clock),
      phase_(phase),
      aggregate_(site.layout.num_elements()) {}

void PolicyDriver::Start(Duration now) {
  policy_->Start(workers_->size(), now);
  // Nobody waits for a worker that is not here; it may join late.
  for (uint32_t i = 0; i < workers_->size(); ++i) {
    if ((*workers_)[i].state != SlotState::kLive) OnLeave(i, now);
  }
}

void PolicyDriver::OnJoin(uint32_t worker, Duration now) {
  Execute(policy_->OnJoin(worker, now));
}

void PolicyDriver::OnLeave(uint32_t worker, Duration now) {
  Execute(policy_->OnLeave(worker, now));
}

void PolicyDriver::OnPull(uint32_t worker, Duration now) {
  Execute(policy_->OnPull(worker, now));
}

void PolicyDriver::OnTick(Duration now) { Execute(policy_->OnTick(now)); }

void PolicyDriver::OnLossEvaluation(double loss, Duration taken_at) {
  policy_->OnLossEvaluation(loss, taken_at);
}

PolicyDecision PolicyDriver::OnCommit(const CommitEvent& event) {
  return policy_->OnCommit(event);
}

void PolicyDriver::Execute(const PolicyDecision& decision) {
  if (decision.flush_aggregate && aggregate_.count() > 0) FlushAggregate();
  if (decision.evaluate_loss) evaluator_->RequestLoss();
  if (const std::optional<double> momentum = policy_->ServerMomentum();
      momentum && *momentum != store_->rule().momentum) {
    MLOG(INFO) << "server momentum " << store_->rule().momentum << " -> "
               << *momentum << " (" << policy_->name() << ")";
    store_->SetMomentum(*momentum);
  }
  AdvanceClock();
  for (uint32_t worker : decision.release) {
    if (worker < workers_->size() &&
        (*workers_)[worker].state == SlotState::kLive &&
        (*workers_)[worker].awaiting_reply()) {
      replies_->Answer(worker);
    }
  }
}

void PolicyDriver::AdvanceClock() {
  clock_->Advance(policy_->clock(), phase_->running());
}

void PolicyDriver::Aggregate(std::span<const UpdateSegment> update) {
  aggregate_.Add(update);
}

void PolicyDriver::FlushAggregate() {
  store_->Apply(aggregate_.Segments());
  aggregate_.Clear();
}

}  // namespace meridian
