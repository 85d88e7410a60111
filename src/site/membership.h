// Who the site's workers are, as the event loop sees it: HELLO (joins,
// reconnects, rejoins after being declared dead, restarts), BYE and
// HEARTBEAT; the sender check every other request passes first; the
// liveness checks that declare silent workers (and those that do not read
// their replies) dead; and the fault events that record it all. The slots
// themselves are the WorkerTable's; the policy hears of every join and
// leave through the PolicyDriver.
//
// Ownership and threads: owned by SiteServer::Impl, driven by its event
// loop alone. Size: per slot one open-event index; the event log is
// bounded (FaultEventLog).
#ifndef MERIDIAN_SITE_MEMBERSHIP_H_
#define MERIDIAN_SITE_MEMBERSHIP_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meridian/net/transport.h"
#include "report/fault_events.h"
#include "site/policy_driver.h"
#include "site/replies.h"
#include "site/site_context.h"
#include "site/site_state.h"
#include "site/worker_endpoint.h"
#include "site/worker_table.h"

namespace meridian {

class Membership {
 public:
  // Not owned, all outliving this.
  Membership(const SiteContext& site, WorkerTable* workers,
             WorkerEndpoint* endpoint, Replies* replies, PolicyDriver* policy,
             const TrainingPhase* phase);
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // The slot behind a request from a live worker over its connection, or
  // nullopt after refusing it (WorkerTable::CheckRequest).
  std::optional<uint32_t> Sender(const Envelope& request,
                                 bool allow_pending = false);

  // Whether `routing_id` is a joined worker's connection
  // (WorkerTable::IsWorkerConnection).
  bool IsWorkerConnection(const std::string& routing_id) const {
    return workers_->IsWorkerConnection(routing_id);
  }

  void HandleHello(const Envelope& hello);
  void HandleBye(const Envelope& bye);
  void HandleHeartbeat(const Envelope& heartbeat);

  // Declares silent workers dead, forgives the event loop's own stalls,
  // and sends HEARTBEATs to the workers whose replies the site holds.
  void CheckLiveness();
  // Declares dead the workers whose replies did not fit their queues
  // (WorkerEndpoint::NoteNotReading), unless they joined again meanwhile.
  void DropWorkersNotReading();

  // This server's fault events (the sync engine keeps its own).
  FaultEventLog& events() { return events_; }
  const FaultEventLog& events() const { return events_; }

 private:
  // A worker was admitted: log, record the event, and during training tell
  // the policy (which releases the joiner's WELCOME when it may start).
  // Before training every live worker waits for the start.
  void OnAdmitted(uint32_t worker, const Admission& admission);
  void OnRestarted(uint32_t worker, const Admission& admission, Duration now);
  // `why`: "silent for 12.0 s", ...
  void DeclareDead(const WorkerTable::Death& death, const std::string& why);
  // The worker's WORKER_DEAD event is resolved: it lasted `dead_s`.
  void CloseDeadEvent(uint32_t worker, double dead_s);

  const SiteContext& site_;
  WorkerTable* const workers_;
  WorkerEndpoint* const endpoint_;
  Replies* const replies_;
  PolicyDriver* const policy_;
  const TrainingPhase* const phase_;
  FaultEventLog events_;
  // Per slot, the index of its unresolved WORKER_DEAD event (-1: none).
  std::vector<int> open_dead_event_;
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_MEMBERSHIP_H_
