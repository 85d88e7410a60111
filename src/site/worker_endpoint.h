// The site server's worker socket: a ROUTER bound to the site's address
// (a tcp:// address through a front, wan/front.h, that bounds the bytes
// each connection can make the process hold), with CURVE and its own ZAP
// handler when the site lists a workers' key, and the per-connection
// bounds of server.limits (EndpointBounds). It
// receives, refuses (logging and counting each refusal), and sends without
// ever waiting for a peer; a reply that does not fit its connection's queue
// is dropped and its worker remembered until the event loop declares it
// dead (Membership::DropWorkersNotReading).
//
// Ownership and threads: owned by SiteServer::Impl, driven by its event
// loop alone. The ZAP handler's thread only answers libzmq's
// authentication requests. It owns the worker socket's ZeroMQ context (a
// ZAP handler serves one context, so the sync engine has its own); members
// are declared so that the socket closes before the handler stops and the
// handler stops before the context ends.
// Size: the not-reading list holds at most one entry per reply sent since
// the loop last took it.
#ifndef MERIDIAN_SITE_WORKER_ENDPOINT_H_
#define MERIDIAN_SITE_WORKER_ENDPOINT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "meridian/core/status.h"
#include "meridian/net/message.h"
#include "meridian/net/security.h"
#include "meridian/net/transport.h"
#include "meridian/wan/front.h"
#include "site/site_context.h"
#include "site/site_state.h"

namespace meridian {

class WorkerEndpoint {
 public:
  // `counters` (not owned) counts the refusals.
  WorkerEndpoint(const SiteContext& site, SiteCounters* counters);
  WorkerEndpoint(const WorkerEndpoint&) = delete;
  WorkerEndpoint& operator=(const WorkerEndpoint&) = delete;

  // Checks that the bounds let every tensor arrive, secures the socket
  // (CURVE, when the site lists worker_curve_public_key; the key pair from
  // `secret_key_file`, see SiteServerOptions) and binds it to `bind`
  // (empty: the site's address). `worker_slots`: the workers the site
  // serves, the most connections its front trusts at once. Call once;
  // errors name the site.
  Status Bind(const std::string& bind, const std::string& secret_key_file,
              size_t worker_slots);

  // The endpoint workers connect to (port resolved when bound to "*").
  const std::string& endpoint() const { return endpoint_; }

  // The socket, for zmq::poll (readable: Receive).
  zmq::pollitem_t PollItem();
  // The message waiting on the socket (or nothing): valid, or refused by
  // DecodeMessage. Errors: the socket failed.
  Result<Received> Receive();
  // The connection `request` came over belongs to the worker this server
  // admitted as slot `worker`: the front lets it hold its queue's worth of
  // the largest messages (EndpointBounds::trusted_connection_bytes), and
  // the slot's earlier connection no longer.
  void Trust(const Envelope& request, uint32_t worker);
  // The front of a tcp:// endpoint (null for ipc:// and inproc://).
  const wan::ConnectionFront* front() const { return front_.get(); }

  // Logs `rejection` of a request and answers its sender with an ERROR
  // (RefuseMessage); counts it.
  void Refuse(const std::string& routing_id, const pb::Header& header,
              const Rejection& rejection);
  void Refuse(const Envelope& request, const Rejection& rejection) {
    Refuse(request.routing_id, request.header, rejection);
  }
  // An ERROR that answers no request (a HEARTBEAT over a connection the
  // server does not know): not logged, not counted; failures ignored.
  void SendError(const std::string& routing_id, const Rejection& rejection);

  // A header of this server with the next sequence number.
  pb::Header NewHeader(pb::MessageType type);
  // Sends now or fails (ResourceExhausted: the peer's queue is full; it
  // does not read). Never waits.
  Status Send(const pb::Header& header, std::vector<zmq::message_t> frames,
              const std::string& routing_id);
  // A HEARTBEAT; one a dying connection cannot take is lost.
  void SendHeartbeat(const std::string& routing_id);

  // `worker`'s reply over `routing_id` did not fit its queue: the event
  // loop declares it dead once it is back at its top.
  void NoteNotReading(uint32_t worker, const std::string& routing_id) {
    not_reading_.emplace_back(worker, routing_id);
  }
  std::vector<std::pair<uint32_t, std::string>> TakeNotReading() {
    return std::exchange(not_reading_, {});
  }

 private:
  // Loads the site's key pair, starts the ZAP handler admitting only the
  // workers' key (user id "<site>/workers") and makes the socket a CURVE
  // server, before it binds: no worker connection is ever admitted without
  // the handler. Does nothing without a workers' key.
  Status Secure(const std::string& secret_key_file);

  const SiteContext& site_;
  SiteCounters* const counters_;
  zmq::context_t context_;  // the worker socket's (and its ZAP handler's)
  // Null unless the worker endpoint is CURVE; outlives socket_.
  std::unique_ptr<ZapHandler> zap_;
  zmq::socket_t socket_;
  // Relays tcp:// connections to socket_; declared after it, so it stops
  // relaying before the socket closes.
  std::unique_ptr<wan::ConnectionFront> front_;
  std::string endpoint_;
  uint64_t sequence_ = 0;  // of the messages this server sends
  // Workers (slot, connection) whose reply did not fit their queue.
  std::vector<std::pair<uint32_t, std::string>> not_reading_;
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_WORKER_ENDPOINT_H_
