#include "sync/mirror_socket.h"

#include <map>
#include <vector>

#include "meridian/core/log.h"

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
    const std::string& secret_key_file, int64_t max_frame_bytes) {
  std::unique_ptr<MirrorSocket> mirror(new MirrorSocket(context));
  MERIDIAN_RETURN_IF_ERROR(mirror->Secure(secret_key_file));
  MERIDIAN_RETURN_IF_ERROR(mirror->Bind(bind, max_frame_bytes));
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

Status MirrorSocket::Bind(const std::string& bind, int64_t max_frame_bytes) {
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
    socket_.bind(bind);
  } catch (const zmq::error_t& error) {
    return UnavailableError("site '" + context_.name +
                            "' cannot listen for peers on '" + bind +
                            "': " + error.what());
  }
  MERIDIAN_ASSIGN_OR_RETURN(endpoint_, BoundEndpoint(socket_));
  return Status::Ok();
}

Result<Received> MirrorSocket::Receive() {
  return ReceiveMessage(socket_, true, std::chrono::milliseconds(0));
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
