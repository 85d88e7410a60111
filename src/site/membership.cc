#include "site/membership.h"

#include "meridian/core/format.h"
#include "meridian/core/log.h"
#include "meridian/net/message.h"

namespace meridian {
namespace {

const char* PendingName(Pending pending) {
  switch (pending) {
    case Pending::kNone:
      return "nothing";
    case Pending::kHello:
      return "its HELLO";
    case Pending::kCommit:
      return "a COMMIT (applied on arrival)";
    case Pending::kPull:
      return "a PULL";
  }
  return "?";
}

}  // namespace

Membership::Membership(const SiteContext& site, WorkerTable* workers,
                       WorkerEndpoint* endpoint, Replies* replies,
                       PolicyDriver* policy, const TrainingPhase* phase)
    : site_(site),
      workers_(workers),
      endpoint_(endpoint),
      replies_(replies),
      policy_(policy),
      phase_(phase),
      events_(site.name(), site.wall_clock),
      open_dead_event_(workers->size(), -1) {}

std::optional<uint32_t> Membership::Sender(const Envelope& request,
                                           bool allow_pending) {
  const WorkerTable::Checked checked = workers_->CheckRequest(
      request.header, request.routing_id, site_.Now(), allow_pending);
  if (!checked.slot) endpoint_->Refuse(request, checked.refusal);
  return checked.slot;
}

void Membership::HandleHello(const Envelope& message) {
  const pb::Endpoint& sender = message.header.sender();
  const pb::Hello& hello = message.header.hello();
  const uint32_t index = hello.worker_index();
  const std::optional<uint32_t> found =
      sender.role() == pb::ROLE_WORKER && sender.id() == index
          ? workers_->Find(sender.site(), index)
          : std::nullopt;
  if (!found) {
    return endpoint_->Refuse(
        message, {pb::ERROR_UNKNOWN_SENDER,
                  "HELLO from worker " + Sanitized(sender.site(), 64) + "/" +
                      std::to_string(index) + ": site server '" + site_.name() +
                      "' serves " + workers_->Describe()});
  }
  if (Check layout = CheckHelloLayout(hello, site_.layout, "worker");
      !layout.ok()) {
    return endpoint_->Refuse(message, layout.rejection());
  }
  const uint32_t worker = *found;
  const Admission admission =
      workers_->Admit(worker, hello.incarnation(), message.routing_id,
                      message.header.sequence(), site_.Now());
  if (admission.kind == Admission::Kind::kRefused) {
    return endpoint_->Refuse(message, admission.refusal);
  }
  // Its commits may now be as large as the model.
  endpoint_->Trust(message, worker);
  if (phase_->finished()) {
    // A process that may hold an unanswered commit sends it again; one
    // started after the end (a restart, `meridian run --resume` of a job
    // whose training is over) learns that it is over and leaves with
    // success.
    MLOG(INFO) << "worker " << (*workers_)[worker].Name()
               << " joined after the end of the job: it is told to stop "
                  "(and may send an unanswered commit again first)";
    return replies_->SendReply(worker);  // WELCOME with stop
  }
  OnAdmitted(worker, admission);
}

void Membership::OnAdmitted(uint32_t worker, const Admission& admission) {
  const WorkerSlot& slot = (*workers_)[worker];
  const bool training = phase_->training();
  const Duration now = site_.clock->Now();
  switch (admission.kind) {
    case Admission::Kind::kJoined:
      if (!training) {
        MLOG(INFO) << "worker " << slot.Name() << " joined ("
                   << workers_->LiveCount() << "/" << workers_->size() << ")";
        return;
      }
      MLOG(INFO) << "worker " << slot.Name() << " joined late ("
                 << workers_->LiveCount() << "/" << workers_->size()
                 << " live)";
      events_.Record(
          pb::WORKER_JOINED_LATE, slot.Name(),
          "joined " + FormatSeconds(phase_->Elapsed(), 1) + " s into training");
      policy_->OnJoin(worker, now);
      return;
    case Admission::Kind::kReconnected:
      MLOG(INFO) << "worker " << slot.Name()
                 << " reconnected (same process, new connection)"
                 << (admission.request_pending
                         ? "; its pending request is answered there"
                         : "");
      // A held request is answered when it is released, as a WELCOME.
      if (training && !admission.request_pending) replies_->Answer(worker);
      return;
    case Admission::Kind::kRejoined:
      MLOG(WARNING) << "worker " << slot.Name() << " is back after "
                    << FormatSeconds(admission.dead_s, 1)
                    << " s declared dead (same process); last commit id "
                    << slot.last_commit_id;
      CloseDeadEvent(worker, admission.dead_s);
      events_.Record(pb::WORKER_REJOINED, slot.Name(),
                     "same process; its last applied commit id " +
                         std::to_string(slot.last_commit_id),
                     admission.dead_s);
      if (training) policy_->OnJoin(worker, now);
      return;
    case Admission::Kind::kRestarted:
      return OnRestarted(worker, admission, now);
    case Admission::Kind::kRefused:
      return;
  }
}

void Membership::OnRestarted(uint32_t worker, const Admission& admission,
                             Duration now) {
  const WorkerSlot& slot = (*workers_)[worker];
  std::string detail = "a new process took the slot";
  if (admission.previous == SlotState::kLive) {
    detail += "; the old one's unanswered request (" +
              std::string(PendingName(admission.dropped)) + ") is dropped";
  }
  MLOG(WARNING) << "worker " << slot.Name() << " restarted (process "
                << slot.incarnations << " of this slot): " << detail;
  if (admission.previous == SlotState::kDead) {
    CloseDeadEvent(worker, admission.dead_s);
  }
  events_.Record(pb::WORKER_RESTARTED, slot.Name(), detail,
                 admission.previous == SlotState::kDead ? admission.dead_s : 0);
  if (!phase_->training()) return;
  if (admission.previous == SlotState::kLive) policy_->OnLeave(worker, now);
  policy_->OnJoin(worker, now);
}

void Membership::HandleBye(const Envelope& message) {
  // A BYE may come while a request is pending (a worker stopped while it
  // waited): the request is dropped.
  const std::optional<uint32_t> worker =
      Sender(message, /*allow_pending=*/true);
  if (!worker) return;
  WorkerSlot& slot = (*workers_)[*worker];
  if (message.header.has_bye()) slot.stats = message.header.bye().stats();
  workers_->Leave(*worker);
  MLOG(INFO) << "worker " << slot.Name() << " left after " << slot.stats.steps()
             << " steps, " << slot.stats.commits() << " commits";
  if (Status status =
          endpoint_->Send(endpoint_->NewHeader(pb::BYE), {}, slot.routing_id);
      !status.ok()) {
    MLOG(WARNING) << "cannot acknowledge BYE of worker " << slot.Name() << ": "
                  << status;
  }
  if (phase_->running()) policy_->OnLeave(*worker, site_.clock->Now());
}

void Membership::HandleHeartbeat(const Envelope& message) {
  if (workers_->OnHeartbeat(message.header, message.routing_id, site_.Now())) {
    return;
  }
  // One of our workers over a connection this server does not know (it
  // restarted, or declared the worker dead): tell it to rejoin now instead
  // of after server_timeout_s of silence.
  endpoint_->SendError(message.routing_id,
                       {pb::ERROR_UNKNOWN_SENDER,
                        "site server '" + site_.name() +
                            "' does not know this connection: join again"});
}

void Membership::CheckLiveness() {
  const double now = site_.Now();
  double stalled_s = 0;
  for (const WorkerTable::Death& death :
       workers_->CheckLiveness(now, &stalled_s)) {
    DeclareDead(death, "silent for " + FormatSeconds(death.silent_s, 1) + " s");
  }
  if (stalled_s > 0) {
    MLOG(WARNING) << "the event loop did not run for "
                  << FormatSeconds(stalled_s, 1)
                  << " s (was this process stopped or starved?): every "
                     "live worker gets a fresh "
                  << FormatSeconds(site_.timeouts.worker_timeout_s, 1)
                  << " s window";
  }
  for (uint32_t worker :
       workers_->DueForHeartbeat(now, site_.timeouts.heartbeat_interval_s)) {
    endpoint_->SendHeartbeat((*workers_)[worker].routing_id);
    workers_->NoteSent(worker, now);
  }
}

void Membership::DropWorkersNotReading() {
  for (const auto& [worker, routing_id] : endpoint_->TakeNotReading()) {
    const WorkerSlot& slot = (*workers_)[worker];
    if (slot.state != SlotState::kLive || slot.routing_id != routing_id) {
      continue;
    }
    DeclareDead(workers_->DeclareDead(worker, site_.Now()),
                "does not read its replies (" +
                    std::to_string(site_.bounds.send_queue) +
                    " wait for it: server.limits.send_queue); its last "
                    "reply is dropped");
  }
}

void Membership::DeclareDead(const WorkerTable::Death& death,
                             const std::string& why) {
  const WorkerSlot& slot = (*workers_)[death.slot];
  MLOG(WARNING) << "worker " << slot.Name() << " " << why << ": declared dead"
                << (death.dropped == Pending::kNone
                        ? std::string()
                        : std::string("; its unanswered request (") +
                              PendingName(death.dropped) +
                              ") will not be answered")
                << "; " << workers_->LiveCount() << " of " << workers_->size()
                << " workers live";
  open_dead_event_[death.slot] =
      events_.Record(pb::WORKER_DEAD, slot.Name(), why);
  if (phase_->running()) policy_->OnLeave(death.slot, site_.clock->Now());
}

void Membership::CloseDeadEvent(uint32_t worker, double dead_s) {
  const int index = open_dead_event_[worker];
  open_dead_event_[worker] = -1;
  events_.Resolve(index, dead_s);
}

}  // namespace meridian
