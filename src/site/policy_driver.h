// The intra-site policy's side of the event loop: hands the policy the
// workers' joins, leaves, pulls, commits, the ticks and the loss
// evaluations, and carries out what it decides — flush the barrier
// aggregate, ask for a loss evaluation, change the server momentum,
// advance the site clock, release the workers it let go. Owns the barrier
// aggregate (BSP: the commits of a round summed until the round closes).
//
// Ownership and threads: owned by SiteServer::Impl, driven by its event
// loop alone; the policy itself is the Impl's (Replies reads its plans).
// Size: the aggregate is one model.
#ifndef MERIDIAN_SITE_POLICY_DRIVER_H_
#define MERIDIAN_SITE_POLICY_DRIVER_H_

#include <cstdint>
#include <span>

#include "meridian/core/clock.h"
#include "meridian/ps/param_store.h"
#include "meridian/sched/policy.h"
#include "site/evaluation.h"
#include "site/replies.h"
#include "site/site_clock.h"
#include "site/site_context.h"
#include "site/site_state.h"
#include "site/worker_table.h"

namespace meridian {

class PolicyDriver {
 public:
  // `site` sizes the aggregate; the rest is not owned and outlives this.
  PolicyDriver(const SiteContext& site, IntraSitePolicy* policy,
               ParameterStore* store, WorkerTable* workers, Replies* replies,
               Evaluation* evaluator, SiteClock* clock,
               const TrainingPhase* phase);
  PolicyDriver(const PolicyDriver&) = delete;
  PolicyDriver& operator=(const PolicyDriver&) = delete;

  const IntraSitePolicy& policy() const { return *policy_; }

  // Training starts at `now` with every slot; the slots not live are left
  // (they may join late).
  void Start(Duration now);
  // Events, each carried out (Execute).
  void OnJoin(uint32_t worker, Duration now);
  void OnLeave(uint32_t worker, Duration now);
  void OnPull(uint32_t worker, Duration now);
  void OnTick(Duration now);
  void OnLossEvaluation(double loss, Duration taken_at);
  // The policy's verdict on a checked commit; the caller carries it out.
  PolicyDecision OnCommit(const CommitEvent& event);

  // Carries out `decision` (see the file comment); releases each worker it
  // names that is live and awaits an answer (Replies::Answer).
  void Execute(const PolicyDecision& decision);
  // Tells the sync every clock completed (SiteClock::Advance).
  void AdvanceClock();

  // The barrier aggregate: a commit of the open round, the round's sum
  // applied to the store, and the aggregate for a checkpoint.
  void Aggregate(std::span<const UpdateSegment> update);
  void FlushAggregate();
  const UpdateAccumulator& aggregate() const { return aggregate_; }
  UpdateAccumulator* mutable_aggregate() { return &aggregate_; }

 private:
  IntraSitePolicy* const policy_;
  ParameterStore* const store_;  // the event loop alone applies
  WorkerTable* const workers_;
  Replies* const replies_;
  Evaluation* const evaluator_;
  SiteClock* const clock_;
  const TrainingPhase* const phase_;
  UpdateAccumulator aggregate_;
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_POLICY_DRIVER_H_
