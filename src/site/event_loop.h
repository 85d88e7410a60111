// One turn of the site server's event loop, and where each message goes.
// It waits for the worker socket and the sync sockets; hands a worker's
// request to its handler (Membership, CommitPath) or answers a control
// request itself (STATUS_REQUEST; SET_PEERS and SHUTDOWN, obeyed only with
// the job's control token); then does the loop's duties: drop the workers
// that do not read, take the sync's messages and release the replies they
// allow, checkpoint, check liveness, say what the site waits for, publish
// metrics. It also ends the job (FinishJob) when a phase or a SHUTDOWN
// says so.
//
// Ownership and threads: owned by SiteServer::Impl; its methods run on the
// event loop's thread (the one that calls SiteServer::Run). Size: fixed.
#ifndef MERIDIAN_SITE_EVENT_LOOP_H_
#define MERIDIAN_SITE_EVENT_LOOP_H_

#include <string>

#include "meridian/core/status.h"
#include "meridian/net/transport.h"
#include "site/commit_path.h"
#include "site/membership.h"
#include "site/policy_driver.h"
#include "site/remote_evaluator.h"
#include "site/replies.h"
#include "site/request_intake.h"
#include "site/site_clock.h"
#include "site/site_context.h"
#include "site/site_durability.h"
#include "site/site_monitor.h"
#include "site/site_state.h"
#include "site/worker_endpoint.h"
#include "sync/sync_engine.h"

namespace meridian {

class SiteEventLoop {
 public:
  // The parts a turn drives; not owned, all outliving this. `sync` is null
  // for a site that syncs with nobody.
  struct Parts {
    WorkerEndpoint* endpoint = nullptr;
    SyncEngine* sync = nullptr;
    Membership* membership = nullptr;
    CommitPath* commits = nullptr;
    Replies* replies = nullptr;
    PolicyDriver* policy = nullptr;
    SiteDurability* durability = nullptr;
    SiteMonitor* monitor = nullptr;
    TrainingPhase* phase = nullptr;
    SiteClock* clock = nullptr;
    // The site's evaluator process, for an external model; null when the
    // server evaluates a built-in model itself.
    RemoteEvaluator* evaluator = nullptr;
  };
  // `control_token`: what SHUTDOWN and SET_PEERS must carry; empty: no
  // control message is obeyed.
  SiteEventLoop(const SiteContext& site, std::string control_token,
                Parts parts);
  SiteEventLoop(const SiteEventLoop&) = delete;
  SiteEventLoop& operator=(const SiteEventLoop&) = delete;

  // Waits up to kPollInterval for the worker socket and the sync sockets
  // (not at all while requests wait in the intake), then handles what
  // arrived and does the loop's duties. Errors: the sockets failed.
  Status PollOnce();

  // Ends training: nothing more is scheduled; waiting workers are told to
  // stop. A BSP aggregate of a clock that never closed is applied, so that
  // no accepted commit is lost. Does nothing once the job ended.
  void FinishJob(const std::string& reason);

  // A SET_PEERS was applied (SiteServerOptions::await_peers).
  bool peers_set() const { return peers_set_; }

 private:
  // Dispatch, with any exception a handler lets out (an allocation that
  // failed under a memory limit, a ZeroMQ error) turned into an
  // ERROR_INTERNAL reply: the request failed, the server goes on. Every
  // handler checks a request completely before it changes the model, so a
  // failure leaves the model as it was.
  void DispatchGuarded(const Envelope& message);
  // Reads what the worker socket holds (`readable`: poll said so) and
  // serves it in RequestIntake's order. Errors: the socket failed.
  Status ServeWorkerSocket(bool readable);
  // Whether `routing_id` is a joined worker's or the evaluator's.
  bool IsJoinedConnection(const std::string& routing_id) const;
  void Dispatch(const Envelope& message);
  // A message of the evaluator role (sender role ROLE_EVALUATOR, or an
  // EVAL_RESULT).
  void DispatchEvaluator(const Envelope& message);
  // Whether a control message carries the job's control token; refuses
  // it otherwise.
  bool Authorized(const Envelope& message);
  void HandleSetPeers(const Envelope& message);
  void SendStatus(const Envelope& request);

  const SiteContext& site_;
  const std::string control_token_;
  const Parts parts_;
  RequestIntake intake_;
  bool peers_set_ = false;
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_EVENT_LOOP_H_
