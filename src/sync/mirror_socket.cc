#include "sync/mirror_socket.h"

#include <algorithm>
#include <map>
#include <vector>

#include "meridian/core/log.h"
#include "sync/front_receive.h"

namespace meridian {
namespace {

// How long the mirror socket keeps unsent acknowledgements when the server
// shuts down (a peer's final flush waits for ours).
constexpr int kMirrorLingerMs = 1000;

}  // namespace

MirrorSocket::MirrorSocket(const SyncContext& context)
    : context_(context), socket_(*context.zmq, zmq::socket_type::router) {}

Result<std::unique_ptr<MirrorSocket>> MirrorSocket::Open(
    const SyncContext& context, const std::string& bind,
    const std::string& secret_key_file, int64_t max_frame_bytes,
    uint64_t peer_credit) {
  std::unique_ptr<MirrorSocket> mirror(new MirrorSocket(context));
  MERIDIAN_RETURN_IF_ERROR(mirror->Secure(secret_key_file));
  MERIDIAN_RETURN_IF_ERROR(mirror->Bind(bind, max_frame_bytes, peer_credit));
  return mirror;
}

Status MirrorSocket::Secure(const std::string& secret_key_file) {
  if (!context_.job.security().curve()) {
    MLOG(WARNING) << "cross-site links are plaintext: security { curve: "
                     "false }";
    return Status::Ok();
  }
  const std::vector<int> peers = context_.role.Peers();
  MERIDIAN_ASSIGN_OR_RETURN(SiteCurveKeys keys,
                            LoadSiteCurveKeys(context_.job, context_.site_index,
                                              peers, secret_key_file));
  std::map<std::string, std::string> allowed;
  for (const auto& [site, key] : keys.peers) allowed[key] = site;
  const std::string owner = "mirror socket of site '" + context_.name + "'";
  MERIDIAN_ASSIGN_OR_RETURN(
      zap_, ZapHandler::Start(*context_.zmq, std::move(allowed), owner));
  MERIDIAN_RETURN_IF_ERROR(
      MakeCurveServer(socket_, keys.own).WithContext(owner));
  MLOG(INFO) << "CURVE on: links to and from " << context_.PeerList()
             << " are encrypted; admitting only their keys; this site's "
                "public key "
             << keys.own.public_key;
  curve_.emplace(std::move(keys));
  return Status::Ok();
}

Status MirrorSocket::Bind(const std::string& bind, int64_t max_frame_bytes,
                          uint64_t peer_credit) {
  const bool fronted = bind.rfind("tcp://", 0) == 0;
  const std::string socket_bind = fronted ? "tcp://127.0.0.1:*" : bind;
  try {
    socket_.set(zmq::sockopt::linger, kMirrorLingerMs);
    socket_.set(zmq::sockopt::router_mandatory, 1);
    // A peer's channel reconnects with the same routing id (its site and
    // incarnation): the new connection takes the id over.
    socket_.set(zmq::sockopt::router_handover, 1);
    // Acknowledgements and errors never block the event loop: one that
    // cannot be queued now is sent again later.
    socket_.set(zmq::sockopt::sndtimeo, 0);
    socket_.set(zmq::sockopt::maxmsgsize, max_frame_bytes);
    if (fronted) {
      socket_.set(zmq::sockopt::backlog, wan::ConnectionFront::kListenBacklog);
    }
    socket_.bind(socket_bind);
  } catch (const zmq::error_t& error) {
    return UnavailableError("site '" + context_.name +
                            "' cannot listen for peers on '" + socket_bind +
                            "': " + error.what());
  }
  MERIDIAN_ASSIGN_OR_RETURN(endpoint_, BoundEndpoint(socket_));
  if (!fronted) return Status::Ok();
  constexpr uint64_t kStrangerCredit = 256 << 10;
  constexpr size_t kMaxConnections = 256;
  wan::FrontOptions front;
  front.listen = bind;
  front.upstream = endpoint_;
  front.name = "mirror socket of site '" + context_.name + "'";
  front.max_connections = kMaxConnections;
  front.untrusted_credit = kStrangerCredit;
  front.trusted_credit = peer_credit;
  front.max_trusted = std::max<size_t>(2 * context_.role.Peers().size(), 2);
  Result<std::unique_ptr<wan::ConnectionFront>> started =
      wan::ConnectionFront::Start(std::move(front));
  if (!started.ok()) {
    return UnavailableError("site '" + context_.name +
                            "' cannot listen for peers on '" + bind +
                            "': " + started.status().message());
  }
  front_ = std::move(*started);
  endpoint_ = front_->endpoint();
  return Status::Ok();
}

Result<Received> MirrorSocket::Receive() {
  return ReceiveThroughFront(socket_, front_.get());
}

void MirrorSocket::Trust(const Envelope& message, int peer_site) {
  if (front_ != nullptr) {
    front_->Trust(message.front_port, static_cast<uint64_t>(peer_site));
  }
}

void MirrorSocket::Refuse(const std::string& routing_id,
                          const pb::Header& header,
                          const Rejection& rejection) {
  ++rejected_;
  RefuseMessage(socket_, context_.self, ++error_sequence_, routing_id, header,
                rejection);
}

void MirrorSocket::Explain(const std::string& routing_id,
                           const pb::Header& header,
                           const Rejection& rejection) {
  // Logged as a refusal is (a few lines per kind and sender, then a
  // count), at INFO: after a restart this is how peers find out.
  MLOG_EVERY_KEY(INFO, "told " + Sanitized(header.sender().site(), 64) +
                           " why: " + pb::ErrorCode_Name(rejection.code))
      << "answered " << DescribeHeader(header) << " with "
      << pb::ErrorCode_Name(rejection.code) << ": " << rejection.reason;
  if (Status status = SendError(socket_, context_.self, ++error_sequence_,
                                rejection, header.sequence(), routing_id);
      !status.ok()) {
    MLOG(WARNING) << "cannot send the error reply: " << status;
  }
}

void MirrorSocket::SendAck(const std::string& routing_id,
                           const pb::MirrorAck& ack) {
  pb::Header header = MakeHeader(pb::MIRROR_ACK, context_.self, 0);
  *header.mutable_mirror_ack() = ack;
  if (SendMessage(socket_, header, {}, routing_id).ok()) ++acks_sent_;
}

}  // namespace meridian
