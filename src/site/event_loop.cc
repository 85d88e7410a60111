#include "site/event_loop.h"

#include <chrono>
#include <map>
#include <new>
#include <optional>
#include <span>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "meridian/core/log.h"
#include "meridian/net/security.h"

namespace meridian {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(20);

}  // namespace

SiteEventLoop::SiteEventLoop(const SiteContext& site, std::string control_token,
                             Parts parts)
    : site_(site), control_token_(std::move(control_token)), parts_(parts) {}

Status SiteEventLoop::PollOnce() {
  WorkerEndpoint& endpoint = *parts_.endpoint;
  std::vector<zmq::pollitem_t> items = {endpoint.PollItem()};
  if (parts_.sync != nullptr) parts_.sync->AddPollItems(&items);
  try {
    zmq::poll(items.data(), items.size(),
              intake_.waiting() > 0 ? std::chrono::milliseconds(0)
                                    : kPollInterval);
  } catch (const zmq::error_t& error) {
    if (error.num() == EINTR) return Status::Ok();  // a signal: look again
    return UnavailableError(std::string("polling: ") + error.what());
  }
  MERIDIAN_RETURN_IF_ERROR(
      ServeWorkerSocket((items[0].revents & ZMQ_POLLIN) != 0));
  parts_.membership->DropWorkersNotReading();
  if (parts_.evaluator != nullptr) parts_.evaluator->OnTick();
  if (parts_.sync != nullptr) {
    parts_.sync->HandleReadable(
        std::span<const zmq::pollitem_t>(items).subspan(1));
    parts_.policy->AdvanceClock();  // the clock floor moves with what peers say
    parts_.clock->ApplyOwnChanges();  // and so does what is held back
    parts_.replies->ReleaseHeld();
  }
  parts_.durability->MaybeCheckpoint();
  parts_.membership->CheckLiveness();
  parts_.monitor->SampleRate();
  parts_.monitor->NoteWaiting(endpoint.endpoint());
  parts_.monitor->Publish();
  return Status::Ok();
}

Status SiteEventLoop::ServeWorkerSocket(bool readable) {
  WorkerEndpoint& endpoint = *parts_.endpoint;
  std::vector<Envelope> first;
  for (size_t i = 0; readable && i < RequestIntake::kReadsPerTurn; ++i) {
    Result<Received> received = endpoint.Receive();
    if (!received.ok()) return received.status();
    if (received->timed_out()) break;
    if (received->refused) {
      endpoint.Refuse(received->refused->routing_id, received->refused->header,
                      received->refused->rejection);
      continue;
    }
    Envelope& message = *received->message;
    if (intake_.ServeFirst(message.routing_id,
                           IsJoinedConnection(message.routing_id))) {
      first.push_back(std::move(message));
      continue;
    }
    std::optional<Envelope> refused = intake_.Wait(std::move(message));
    if (refused) {
      endpoint.Refuse(
          *refused,
          {pb::ERROR_BUSY,
           "site server '" + site_.name() + "' has " +
               std::to_string(intake_.waiting()) +
               " requests of connections that have not joined waiting; "
               "nothing was done, send it again later"});
    }
  }
  for (const Envelope& message : first) DispatchGuarded(message);
  for (size_t i = 0; i < RequestIntake::kOthersPerTurn; ++i) {
    std::optional<Envelope> next = intake_.Next();
    if (!next) break;
    DispatchGuarded(*next);
  }
  return Status::Ok();
}

bool SiteEventLoop::IsJoinedConnection(const std::string& routing_id) const {
  return parts_.membership->IsWorkerConnection(routing_id) ||
         (parts_.evaluator != nullptr &&
          parts_.evaluator->IsSessionConnection(routing_id));
}

void SiteEventLoop::FinishJob(const std::string& reason) {
  if (!parts_.phase->Finish(reason)) return;
  MLOG(INFO) << "finishing: " << reason;
  const uint32_t open = parts_.policy->aggregate().count();
  if (open > 0) {
    MLOG(INFO) << "applying the open barrier's " << open
               << " commits before stopping";
    parts_.policy->FlushAggregate();
  }
  parts_.replies->AnswerAllWaiting();
}

void SiteEventLoop::DispatchGuarded(const Envelope& message) {
  std::string what;
  try {
    return Dispatch(message);
  } catch (const std::bad_alloc&) {
    what = "out of memory";
  } catch (const zmq::error_t& error) {
    what = std::string("ZeroMQ: ") + error.what();
  } catch (const std::exception& error) {
    what = error.what();
  }
  parts_.endpoint->Refuse(
      message, {pb::ERROR_INTERNAL, "site server '" + site_.name() +
                                        "' failed handling it (" + what +
                                        "); the model is unchanged"});
}

void SiteEventLoop::DispatchEvaluator(const Envelope& message) {
  if (parts_.evaluator == nullptr) {
    return parts_.endpoint->Refuse(
        message, {pb::ERROR_UNEXPECTED,
                  "site server '" + site_.name() +
                      "' evaluates its built-in model itself: it takes no "
                      "evaluator"});
  }
  parts_.evaluator->Handle(message);
}

void SiteEventLoop::Dispatch(const Envelope& message) {
  // STATUS_REQUEST is answered to anyone (docs/worker-protocol.md): an
  // evaluator waiting for its server too.
  const bool status = message.header.type() == pb::STATUS_REQUEST;
  if ((message.header.sender().role() == pb::ROLE_EVALUATOR && !status) ||
      message.header.type() == pb::EVAL_RESULT) {
    return DispatchEvaluator(message);
  }
  switch (message.header.type()) {
    case pb::HELLO:
      return parts_.membership->HandleHello(message);
    case pb::COMMIT:
      return parts_.commits->HandleCommit(message);
    case pb::PULL:
      return parts_.commits->HandlePull(message);
    case pb::BYE:
      return parts_.membership->HandleBye(message);
    case pb::HEARTBEAT:
      return parts_.membership->HandleHeartbeat(message);
    case pb::STATUS_REQUEST:
      return SendStatus(message);
    case pb::SET_PEERS:
      if (!Authorized(message)) return;
      return HandleSetPeers(message);
    case pb::SHUTDOWN:
      if (!Authorized(message)) return;
      FinishJob("shutdown requested: " +
                (message.header.shutdown().reason().empty()
                     ? std::string("no reason given")
                     : message.header.shutdown().reason()));
      return SendStatus(message);
    default:
      return parts_.endpoint->Refuse(
          message,
          {pb::ERROR_UNEXPECTED, pb::MessageType_Name(message.header.type()) +
                                     " is not a request a site server serves"});
  }
}

bool SiteEventLoop::Authorized(const Envelope& message) {
  if (!control_token_.empty() &&
      ConstantTimeEquals(message.header.control_token(), control_token_)) {
    return true;
  }
  parts_.endpoint->Refuse(
      message, {pb::ERROR_UNAUTHORIZED,
                control_token_.empty()
                    ? "site server '" + site_.name() +
                          "' obeys no control message (it was started "
                          "without a control token)"
                    : "control messages need the job's control token"});
  return false;
}

void SiteEventLoop::HandleSetPeers(const Envelope& message) {
  WorkerEndpoint& endpoint = *parts_.endpoint;
  if (parts_.sync == nullptr) {
    return endpoint.Refuse(message, {pb::ERROR_UNEXPECTED,
                                     "site '" + site_.name() +
                                         "' does not sync with other sites"});
  }
  if (parts_.phase->training()) {
    return endpoint.Refuse(message, {pb::ERROR_UNEXPECTED,
                                     "peers are set before training starts"});
  }
  std::map<std::string, std::string> endpoints;
  for (const pb::Peer& peer : message.header.peers().peer()) {
    endpoints[peer.site()] = peer.endpoint();
  }
  if (Status status = parts_.sync->SetPeerEndpoints(endpoints); !status.ok()) {
    return endpoint.Refuse(message,
                           {pb::ERROR_UNKNOWN_SENDER, status.message()});
  }
  peers_set_ = true;
  SendStatus(message);
}

void SiteEventLoop::SendStatus(const Envelope& request) {
  pb::Header header = parts_.endpoint->NewHeader(pb::STATUS_REPLY);
  header.set_clock(parts_.clock->value());
  parts_.monitor->FillStatus(header.mutable_status());
  if (Status sent = parts_.endpoint->Send(header, {}, request.routing_id);
      !sent.ok() && sent.code() != StatusCode::kResourceExhausted) {
    // (A client that does not read its answers just loses them.)
    MLOG(WARNING) << "cannot answer a status request: " << sent;
  }
}

}  // namespace meridian
