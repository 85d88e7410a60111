#include "meridian/policy.h"

#include <algorithm>

namespace meridian {
namespace {

pb::CommitPlan StepPlan(uint32_t local_steps) {
  pb::CommitPlan plan;
  plan.set_local_steps(local_steps);
  plan.set_interval_s(0);
  return plan;
}

// Bulk synchronous: every worker commits once per clock; the commits of a
// clock are summed and applied together, and nobody gets the model back
// until every worker still in the job has committed that clock.
class BspPolicy final : public IntraSitePolicy {
 public:
  explicit BspPolicy(uint32_t local_steps) : local_steps_(local_steps) {}

  std::string_view name() const override { return "bsp"; }

  void Start(uint32_t num_workers, Duration /*now*/) override {
    committed_.assign(num_workers, false);
    active_.assign(num_workers, true);
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
      // A departed worker's pending commit (if any) stays in the aggregate:
      // it was accepted and is applied with the rest of its clock.
      MaybeCloseClock(&decision);
    }
    return decision;
  }

  pb::CommitPlan PlanFor(uint32_t /*worker*/) const override {
    return StepPlan(local_steps_);
  }

  uint64_t clock() const override { return clock_; }

 private:
  void MaybeCloseClock(PolicyDecision* decision) {
    bool any_committed = false;
    for (size_t w = 0; w < committed_.size(); ++w) {
      if (active_[w] && !committed_[w]) return;  // still waiting for w
      any_committed = any_committed || committed_[w];
    }
    if (!any_committed) return;
    decision->flush_aggregate = true;
    for (size_t w = 0; w < committed_.size(); ++w) {
      if (committed_[w] && active_[w]) {
        decision->release.push_back(static_cast<uint32_t>(w));
      }
    }
    std::fill(committed_.begin(), committed_.end(), false);
    ++clock_;
  }

  uint32_t local_steps_;
  std::vector<bool> committed_;  // committed in the current clock
  std::vector<bool> active_;     // still in the job
  uint64_t clock_ = 0;
};

// Fully asynchronous (TAP): every commit is applied and answered at once.
class AsyncPolicy final : public IntraSitePolicy {
 public:
  explicit AsyncPolicy(uint32_t local_steps) : local_steps_(local_steps) {}

  std::string_view name() const override { return "async"; }

  void Start(uint32_t num_workers, Duration /*now*/) override {
    num_workers_ = std::max<uint32_t>(num_workers, 1);
  }

  PolicyDecision OnCommit(const CommitEvent& event) override {
    ++commits_;
    PolicyDecision decision;
    decision.release.push_back(event.worker);
    return decision;
  }

  PolicyDecision OnPull(uint32_t worker, Duration /*now*/) override {
    PolicyDecision decision;
    decision.release.push_back(worker);
    return decision;
  }

  PolicyDecision OnLeave(uint32_t /*worker*/, Duration /*now*/) override {
    return {};
  }

  pb::CommitPlan PlanFor(uint32_t /*worker*/) const override {
    return StepPlan(local_steps_);
  }

  uint64_t clock() const override { return commits_ / num_workers_; }

 private:
  uint32_t local_steps_;
  uint32_t num_workers_ = 1;
  uint64_t commits_ = 0;
};

}  // namespace

Result<std::unique_ptr<IntraSitePolicy>> MakePolicy(
    const pb::PolicyConfig& config) {
  const uint32_t local_steps = std::max<uint32_t>(config.local_steps(), 1);
  switch (config.kind()) {
    case pb::BSP:
      return std::unique_ptr<IntraSitePolicy>(new BspPolicy(local_steps));
    case pb::ASYNC:
      return std::unique_ptr<IntraSitePolicy>(new AsyncPolicy(local_steps));
    case pb::POLICY_KIND_UNSPECIFIED:
      break;
  }
  return InvalidArgumentError("policy kind is not set or unknown");
}

}  // namespace meridian
