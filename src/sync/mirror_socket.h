// The mirror socket: the ROUTER where every peer's channel connects and
// sends its messages, and where this site answers them (acknowledgements,
// ERROR replies). Under security.curve it is a CURVE server that admits
// only the peers' keys (a ZAP handler on the engine's context); the keys
// are also what this site's channels need as CURVE clients.
//
// Ownership and threads: owned by the SyncEngine; used by the site
// server's event-loop thread only (the ZAP handler runs its own thread,
// security.h). Size: fixed; ZeroMQ bounds each frame it accepts
// (ZMQ_MAXMSGSIZE) and sends never block (what cannot be queued now is
// sent again later by the caller).
#ifndef MERIDIAN_SYNC_MIRROR_SOCKET_H_
#define MERIDIAN_SYNC_MIRROR_SOCKET_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <zmq.hpp>

#include "meridian/core/status.h"
#include "meridian/net/message.h"
#include "meridian/net/security.h"
#include "meridian/net/transport.h"
#include "meridian/wan/front.h"
#include "sync/sync_context.h"

namespace meridian {

class MirrorSocket {
 public:
  // With security.curve: loads the keys (`secret_key_file`: as
  // SyncEngineOptions says), starts the ZAP handler (before the socket
  // binds, so no connection is ever admitted without it) and makes the
  // socket a CURVE server. Without: says the links are plaintext. Then
  // binds to `bind`; peers' frames above `max_frame_bytes` drop their
  // connection before ZeroMQ allocates them. A tcp:// `bind` is served
  // through a front (wan/front.h): a connection may have sent at most
  // 256 KiB that this site has not taken until it speaks as a peer
  // (Trust), `peer_credit` after, and at most twice the peers' number of
  // connections are trusted at once.
  static Result<std::unique_ptr<MirrorSocket>> Open(
      const SyncContext& context, const std::string& bind,
      const std::string& secret_key_file, int64_t max_frame_bytes,
      uint64_t peer_credit);
  MirrorSocket(const MirrorSocket&) = delete;
  MirrorSocket& operator=(const MirrorSocket&) = delete;

  // The endpoint peers connect to (port resolved).
  const std::string& endpoint() const { return endpoint_; }
  // This site's keys and its peers' public keys (null without CURVE).
  const SiteCurveKeys* curve() const { return curve_ ? &*curve_ : nullptr; }
  zmq::pollitem_t PollItem() { return {socket_.handle(), 0, ZMQ_POLLIN, 0}; }

  // The next message waiting, without blocking (timed out: none).
  Result<Received> Receive();
  // `message` came from the site `peer_site` (its index in the job), one
  // this site syncs with: its connection may hold `peer_credit` (see
  // Open), the peer's earlier connection no longer.
  void Trust(const Envelope& message, int peer_site);

  // Refuses `header` (logged, answered with an ERROR unless a HEARTBEAT)
  // and counts it (rejected()).
  void Refuse(const std::string& routing_id, const pb::Header& header,
              const Rejection& rejection);
  // Tells the sender why without counting a refusal (a peer that must
  // introduce itself first: after a restart it is how peers find out).
  void Explain(const std::string& routing_id, const pb::Header& header,
               const Rejection& rejection);
  // Best effort: a lost or unroutable acknowledgement is sent again later.
  void SendAck(const std::string& routing_id, const pb::MirrorAck& ack);

  uint64_t rejected() const { return rejected_; }
  void set_rejected(uint64_t rejected) { rejected_ = rejected; }
  uint64_t acks_sent() const { return acks_sent_; }

 private:
  MirrorSocket(const SyncContext& context);
  Status Secure(const std::string& secret_key_file);
  Status Bind(const std::string& bind, int64_t max_frame_bytes,
              uint64_t peer_credit);

  const SyncContext& context_;
  // CURVE (security.curve): this site's keys and its peers' public keys,
  // and the ZAP handler of the context that admits only those peers. The
  // handler is declared before socket_ so that it outlives the socket.
  std::optional<SiteCurveKeys> curve_;
  std::unique_ptr<ZapHandler> zap_;
  zmq::socket_t socket_;
  // Relays tcp:// connections to socket_ (null otherwise); declared after
  // it, so it stops relaying before the socket closes.
  std::unique_ptr<wan::ConnectionFront> front_;
  std::string endpoint_;
  uint64_t error_sequence_ = 0;
  uint64_t rejected_ = 0;
  uint64_t acks_sent_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_SYNC_MIRROR_SOCKET_H_
