// COMMIT and PULL, the requests that read and write the model. A commit is
// checked in one order — its sender, then its bytes parsed against the
// layout (ParseCommit), then what the site makes of it (an id applied
// already, a base newer than the model, the policy's verdict) — and then
// applied to the store, added to the round's aggregate, or refused; its
// answer goes out at once or when the policy releases it (Replies). A
// replay (Commit.replay_first_id: commits a restarted site lost, which
// their worker kept) is applied at once, outside the policy.
//
// Ownership and threads: owned by SiteServer::Impl, driven by its event
// loop alone (the only thread that applies to the store). Holds no decoded
// state: a commit's payload is borrowed from its frames while its handler
// runs. Size: fixed.
#ifndef MERIDIAN_SITE_COMMIT_PATH_H_
#define MERIDIAN_SITE_COMMIT_PATH_H_

#include <cstdint>

#include "meridian/net/message.h"
#include "meridian/net/transport.h"
#include "meridian/ps/param_store.h"
#include "site/membership.h"
#include "site/policy_driver.h"
#include "site/replies.h"
#include "site/site_context.h"
#include "site/site_durability.h"
#include "site/site_state.h"
#include "site/worker_endpoint.h"
#include "site/worker_table.h"

namespace meridian {

class CommitPath {
 public:
  // Not owned, all outliving this.
  CommitPath(const SiteContext& site, ParameterStore* store,
             WorkerTable* workers, Membership* membership,
             WorkerEndpoint* endpoint, Replies* replies, PolicyDriver* policy,
             SiteDurability* durability, const TrainingPhase* phase,
             SiteCounters* counters);
  CommitPath(const CommitPath&) = delete;
  CommitPath& operator=(const CommitPath&) = delete;

  void HandleCommit(const Envelope& commit);
  void HandlePull(const Envelope& pull);

 private:
  // The commit ids a replay covers.
  struct ReplayRange {
    uint64_t first = 0;
    uint64_t last = 0;
  };
  // Refused (ERROR_MALFORMED) when the first id is above the last.
  static Parsed<ReplayRange> ParseReplay(const pb::Commit& fields);
  // A replay: applied at once when none of its ids is applied, answered as
  // a duplicate when all are, refused when some are.
  void HandleReplay(const Envelope& message, uint32_t worker,
                    WorkerCommit& commit);
  // The slot's commit id is applied (the worker table, the log).
  void RecordApplied(uint32_t worker, uint64_t commit_id);
  // The commit's id was applied before (it is sent again after a
  // reconnect): answered with the model, never applied twice.
  void AnswerDuplicate(uint32_t worker, const pb::Commit& fields,
                       RowReads reads);
  // The slot's pending request is now this commit, answered with the
  // whole model or the rows in `reads`.
  void TakeRequest(uint32_t worker, const pb::Commit& fields, RowReads reads);
  // Asks the policy about an accepted commit and carries out its verdict.
  void Decide(const Envelope& message, uint32_t worker,
              const WorkerCommit& commit);
  // Applies `update` to the store (a commit counted).
  void Apply(const ModelPayload& update);
  // Applies `update` and copies the result into `worker`'s reply in one
  // pass over the model, then sends it.
  void ApplyAndAnswer(uint32_t worker, const ModelPayload& update);
  // A PULL's ranges: inside the layout, at most ReplyFloatLimit floats.
  Check CheckPull(const pb::Pull& pull) const;
  // Floats one PULL reply may carry: the configured limit, at least one
  // whole model (what every COMMIT is answered with anyway).
  uint64_t ReplyFloatLimit() const;

  const SiteContext& site_;
  ParameterStore* const store_;
  WorkerTable* const workers_;
  Membership* const membership_;
  WorkerEndpoint* const endpoint_;
  Replies* const replies_;
  PolicyDriver* const policy_;
  SiteDurability* const durability_;
  const TrainingPhase* const phase_;
  SiteCounters* const counters_;
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_COMMIT_PATH_H_
