#include "site/worker_endpoint.h"

#include <algorithm>
#include <chrono>

#include "meridian/core/format.h"
#include "meridian/core/log.h"
#include "meridian/sync/addresses.h"

namespace meridian {

EndpointBounds EndpointBounds::FromConfig(const pb::EndpointLimits& limits,
                                          const ModelLayout& layout) {
  constexpr uint32_t kDefaultSendQueue = 4;
  constexpr uint32_t kDefaultReceiveQueue = 8;
  const uint64_t largest_tensor_bytes =
      layout.LargestTensorSize() * sizeof(float);
  EndpointBounds bounds;
  bounds.max_frame_bytes =
      limits.max_frame_bytes() > 0
          ? limits.max_frame_bytes()
          : std::max<uint64_t>(largest_tensor_bytes, kMaxHeaderBytes);
  bounds.max_reply_floats = limits.max_reply_floats() > 0
                                ? limits.max_reply_floats()
                                : layout.num_elements();
  bounds.send_queue =
      limits.send_queue() > 0 ? limits.send_queue() : kDefaultSendQueue;
  bounds.receive_queue = limits.receive_queue() > 0 ? limits.receive_queue()
                                                    : kDefaultReceiveQueue;
  return bounds;
}

uint64_t EndpointBounds::PerConnectionBytes(const ModelLayout& layout) const {
  const uint64_t frames = layout.tensors().size() + 1;
  const uint64_t largest_message =
      std::min(frames * max_frame_bytes,
               kMaxHeaderBytes + layout.num_elements() * sizeof(float));
  return static_cast<uint64_t>(send_queue + receive_queue) *
         std::max(largest_message, max_frame_bytes);
}

WorkerEndpoint::WorkerEndpoint(const SiteContext& site, SiteCounters* counters)
    : site_(site),
      counters_(counters),
      socket_(context_, zmq::socket_type::router) {}

Status WorkerEndpoint::Bind(const std::string& bind_to,
                            const std::string& secret_key_file) {
  const EndpointBounds& bounds = site_.bounds;
  for (const TensorInfo& tensor : site_.layout.tensors()) {
    if (tensor.size * sizeof(float) > bounds.max_frame_bytes) {
      return InvalidArgumentError(
          "server.limits.max_frame_bytes " +
          std::to_string(bounds.max_frame_bytes) + " is below the " +
          std::to_string(tensor.size * sizeof(float)) + " bytes of tensor '" +
          tensor.name +
          "': no commit could arrive (leave it 0 for the "
          "default)");
    }
  }
  const std::string bind =
      bind_to.empty() ? BindEndpointFor(site_.config.address()) : bind_to;
  MERIDIAN_RETURN_IF_ERROR(Secure(secret_key_file));
  try {
    socket_.set(zmq::sockopt::linger, 0);
    // Fail loudly (EHOSTUNREACH) instead of dropping a reply to a worker
    // that went away.
    socket_.set(zmq::sockopt::router_mandatory, 1);
    // Never wait for a peer: a reply that does not fit its connection's
    // queue fails at once (Replies::Deliver says what happens then).
    socket_.set(zmq::sockopt::sndtimeo, 0);
    socket_.set(zmq::sockopt::sndhwm, static_cast<int>(bounds.send_queue));
    socket_.set(zmq::sockopt::rcvhwm, static_cast<int>(bounds.receive_queue));
    // A frame announced bigger than any valid message has drops its
    // connection before ZeroMQ allocates it.
    socket_.set(zmq::sockopt::maxmsgsize,
                static_cast<int64_t>(bounds.max_frame_bytes));
    socket_.bind(bind);
  } catch (const zmq::error_t& error) {
    return UnavailableError("site '" + site_.name() + "' cannot listen on '" +
                            bind + "': " + error.what());
  }
  MERIDIAN_ASSIGN_OR_RETURN(endpoint_, BoundEndpoint(socket_));
  return Status::Ok();
}

Status WorkerEndpoint::Secure(const std::string& secret_key_file) {
  if (!WorkerCurveEnabled(site_.job, site_.site_index)) return Status::Ok();
  const std::string owner = "worker socket of site '" + site_.name() + "'";
  MERIDIAN_ASSIGN_OR_RETURN(
      SiteCurveKeys keys,
      LoadSiteCurveKeys(site_.job, site_.site_index, {}, secret_key_file));
  MERIDIAN_ASSIGN_OR_RETURN(
      zap_, ZapHandler::Start(context_,
                              {{site_.config.worker_curve_public_key(),
                                site_.name() + "/workers"}},
                              owner));
  MERIDIAN_RETURN_IF_ERROR(
      MakeCurveServer(socket_, keys.own).WithContext(owner));
  MLOG(INFO) << "CURVE on the worker endpoint: admitting only the workers' "
                "key "
             << site_.config.worker_curve_public_key()
             << "; this site's public key " << keys.own.public_key;
  return Status::Ok();
}

zmq::pollitem_t WorkerEndpoint::PollItem() {
  return {socket_.handle(), 0, ZMQ_POLLIN, 0};
}

Result<Received> WorkerEndpoint::Receive() {
  return ReceiveMessage(socket_, true, std::chrono::milliseconds(0));
}

void WorkerEndpoint::Refuse(const std::string& routing_id,
                            const pb::Header& header,
                            const Rejection& rejection) {
  ++counters_->rejected;
  RefuseMessage(socket_, site_.self, ++sequence_, routing_id, header,
                rejection);
}

void WorkerEndpoint::SendError(const std::string& routing_id,
                               const Rejection& rejection) {
  (void)meridian::SendError(socket_, site_.self, ++sequence_, rejection, 0,
                            routing_id);
}

pb::Header WorkerEndpoint::NewHeader(pb::MessageType type) {
  return MakeHeader(type, site_.self, ++sequence_);
}

Status WorkerEndpoint::Send(const pb::Header& header,
                            std::vector<zmq::message_t> frames,
                            const std::string& routing_id) {
  return SendMessage(socket_, header, std::move(frames), routing_id);
}

void WorkerEndpoint::SendHeartbeat(const std::string& routing_id) {
  pb::Header heartbeat = MakeHeader(pb::HEARTBEAT, site_.self, 0);
  heartbeat.mutable_heartbeat();
  // Never blocks; a heartbeat a dying connection cannot take is lost.
  (void)TrySendMessage(socket_, heartbeat, routing_id);
}

}  // namespace meridian
