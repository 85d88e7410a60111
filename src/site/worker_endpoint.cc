#include "site/worker_endpoint.h"

#include <algorithm>
#include <chrono>

#include "meridian/core/format.h"
#include "meridian/core/log.h"
#include "meridian/core/socket_close.h"
#include "meridian/sync/addresses.h"
#include "sync/front_receive.h"

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
  constexpr uint32_t kDefaultMaxConnections = 1024;
  constexpr uint64_t kSlackBytes = 64 << 10;
  constexpr double kDefaultStallSeconds = 30;
  bounds.max_connections = limits.max_connections() > 0
                               ? limits.max_connections()
                               : kDefaultMaxConnections;
  // Before it joined, a worker sends a HELLO carrying the model's layout.
  pb::Hello hello;
  hello.set_worker_index(UINT32_MAX);
  hello.set_incarnation(UINT64_MAX);
  LayoutToSpecs(layout, hello.mutable_layout());
  bounds.untrusted_connection_bytes =
      limits.untrusted_connection_bytes() > 0
          ? limits.untrusted_connection_bytes()
          : kSlackBytes + 2 * hello.ByteSizeLong();
  bounds.trusted_connection_bytes =
      limits.trusted_connection_bytes() > 0
          ? limits.trusted_connection_bytes()
          : bounds.receive_queue * bounds.LargestMessageBytes(layout) +
                kSlackBytes;
  bounds.connection_stall_s = limits.connection_stall_s() > 0
                                  ? limits.connection_stall_s()
                                  : kDefaultStallSeconds;
  bounds.untrusted_messages_per_s =
      limits.untrusted_messages_per_s() > 0
          ? limits.untrusted_messages_per_s()
          : wan::FrontOptions::kDefaultUntrustedMessagesPerSecond;
  return bounds;
}

uint64_t EndpointBounds::LargestMessageBytes(const ModelLayout& layout) const {
  const uint64_t frames = layout.tensors().size() + 1;
  return std::max(std::min(frames * max_frame_bytes,
                           kMaxHeaderBytes +
                               layout.num_elements() * sizeof(float)),
                  max_frame_bytes);
}

uint64_t EndpointBounds::PerConnectionBytes(const ModelLayout& layout) const {
  return static_cast<uint64_t>(send_queue + receive_queue) *
         LargestMessageBytes(layout);
}

WorkerEndpoint::WorkerEndpoint(const SiteContext& site, SiteCounters* counters)
    : site_(site),
      counters_(counters),
      socket_(context_, zmq::socket_type::router) {}

Status WorkerEndpoint::Bind(const std::string& bind_to,
                            const std::string& secret_key_file,
                            size_t worker_slots) {
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
  // A tcp:// endpoint is served through a front (wan/front.h) that bounds
  // what each connection can make this process hold; the socket itself
  // listens on loopback only. ipc:// and inproc:// endpoints are local.
  const bool fronted = bind.rfind("tcp://", 0) == 0;
  const std::string socket_bind = fronted ? "tcp://127.0.0.1:*" : bind;
  MERIDIAN_RETURN_IF_ERROR(Secure(secret_key_file));
  try {
    socket_.set(zmq::sockopt::linger, kSocketCloseLingerMs);
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
    if (fronted) {
      socket_.set(zmq::sockopt::backlog, wan::ConnectionFront::kListenBacklog);
    }
    socket_.bind(socket_bind);
  } catch (const zmq::error_t& error) {
    return UnavailableError("site '" + site_.name() + "' cannot listen on '" +
                            socket_bind + "': " + error.what());
  }
  MERIDIAN_ASSIGN_OR_RETURN(endpoint_, BoundEndpoint(socket_));
  if (!fronted) return Status::Ok();
  wan::FrontOptions front;
  front.listen = bind;
  front.upstream = endpoint_;
  front.name = "worker endpoint of site '" + site_.name() + "'";
  front.max_connections = bounds.max_connections;
  front.untrusted_credit = bounds.untrusted_connection_bytes;
  front.trusted_credit = bounds.trusted_connection_bytes;
  front.max_trusted = std::max<size_t>(worker_slots, 1);
  front.stall_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(bounds.connection_stall_s * 1000));
  front.untrusted_messages_per_s = bounds.untrusted_messages_per_s;
  Result<std::unique_ptr<wan::ConnectionFront>> started =
      wan::ConnectionFront::Start(std::move(front));
  if (!started.ok()) {
    return UnavailableError("site '" + site_.name() + "' cannot listen on '" +
                            bind + "': " + started.status().message());
  }
  front_ = std::move(*started);
  endpoint_ = front_->endpoint();
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
  return ReceiveThroughFront(socket_, front_.get());
}

void WorkerEndpoint::Trust(const Envelope& request, uint32_t worker) {
  if (front_ != nullptr) front_->Trust(request.front_port, worker);
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
