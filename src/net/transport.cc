#include "meridian/net/transport.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <thread>
#include <zmq_addon.hpp>

#include "meridian/core/log.h"
#include "meridian/core/socket_close.h"
#include "meridian/net/security.h"

namespace meridian {
namespace {

Status FromZmqError(const zmq::error_t& error, std::string_view what) {
  std::string message(what);
  message += ": ";
  message += error.what();
  // ETERM: the context is shutting down, i.e. we were asked to stop.
  if (error.num() == ETERM) return CancelledError(std::move(message));
  return UnavailableError(std::move(message));
}

}  // namespace

std::span<const float> FloatsOf(const zmq::message_t& frame,
                                std::vector<float>* scratch) {
  const size_t count = frame.size() / sizeof(float);
  const auto address = reinterpret_cast<uintptr_t>(frame.data());
  if (address % alignof(float) == 0) {
    return {static_cast<const float*>(frame.data()), count};
  }
  scratch->resize(count);
  std::memcpy(scratch->data(), frame.data(), count * sizeof(float));
  return {scratch->data(), count};
}

zmq::message_t MakeFloatFrame(size_t count) {
  return zmq::message_t(count * sizeof(float));
}

zmq::message_t CopyFloatFrame(std::span<const float> values) {
  return zmq::message_t(values.data(), values.size_bytes());
}

namespace {

// Sends the first frames of a message: the routing id (unless empty) and
// the header, each with `flags`; `more`: payload frames follow. When ZeroMQ
// does not take a frame: ResourceExhausted with `blocked`. Throws
// zmq::error_t as socket.send does.
Status SendHead(zmq::socket_t& socket, const pb::Header& header,
                std::string_view routing_id, zmq::send_flags flags, bool more,
                const char* blocked) {
  std::string bytes;
  if (!header.SerializeToString(&bytes)) {
    return InternalError("cannot serialise header " + DescribeHeader(header));
  }
  if (!routing_id.empty()) {
    zmq::message_t id(routing_id.data(), routing_id.size());
    if (!socket.send(std::move(id), zmq::send_flags::sndmore | flags)) {
      return ResourceExhaustedError(blocked);
    }
  }
  const zmq::send_flags header_flags =
      more ? zmq::send_flags::sndmore | flags : flags;
  if (!socket.send(zmq::message_t(bytes.data(), bytes.size()), header_flags)) {
    return ResourceExhaustedError(blocked);
  }
  return Status::Ok();
}

}  // namespace

Status SendMessage(zmq::socket_t& socket, const pb::Header& header,
                   std::vector<zmq::message_t> payload,
                   std::string_view routing_id) {
  try {
    MERIDIAN_RETURN_IF_ERROR(SendHead(
        socket, header, routing_id, zmq::send_flags::none, !payload.empty(),
        "the peer's queue is full (it does not read)"));
    for (size_t i = 0; i < payload.size(); ++i) {
      const auto flags = i + 1 < payload.size() ? zmq::send_flags::sndmore
                                                : zmq::send_flags::none;
      // A multipart message is atomic in ZeroMQ: once the first frame was
      // accepted the rest are queued, so this cannot half-fail on EAGAIN.
      socket.send(std::move(payload[i]), flags);
    }
  } catch (const zmq::error_t& error) {
    return FromZmqError(error, "sending " + DescribeHeader(header));
  }
  return Status::Ok();
}

Status TrySendMessage(zmq::socket_t& socket, const pb::Header& header,
                      std::string_view routing_id) {
  try {
    // After an accepted first frame the last one is queued with it (a
    // multipart message is atomic).
    MERIDIAN_RETURN_IF_ERROR(SendHead(socket, header, routing_id,
                                      zmq::send_flags::dontwait,
                                      /*more=*/false, "send would block"));
  } catch (const zmq::error_t& error) {
    return FromZmqError(error, "sending " + DescribeHeader(header));
  }
  return Status::Ok();
}

Result<Received> ReceiveMessage(zmq::socket_t& socket, bool routed,
                                std::chrono::milliseconds timeout,
                                ReceivedFrom* from) {
  std::vector<zmq::message_t> frames;
  try {
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    const int ready = zmq::poll(&item, 1, timeout);
    if (ready == 0) return Received{};
    if (!zmq::recv_multipart(socket, std::back_inserter(frames),
                             zmq::recv_flags::dontwait)) {
      return Received{};
    }
  } catch (const zmq::error_t& error) {
    // A signal interrupted the wait: report nothing received so that the
    // caller's loop can look at its stop flag.
    if (error.num() == EINTR) return Received{};
    return FromZmqError(error, "receiving");
  }
  Received received;
  size_t first = 0;
  std::string routing_id;
  if (routed) {
    if (frames.empty()) return Received{};  // cannot even answer
    routing_id = frames[0].to_string();
    first = 1;
  }
  if (from != nullptr) {
    *from = ReceivedFrom{};
    for (size_t i = first; i < frames.size(); ++i) {
      from->bytes += frames[i].size();
      ++from->frames;
      // Every frame that came off a connection carries its metadata.
      if (from->fd < 0) {
        if (const char* fd = zmq_msg_gets(frames[i].handle(), "__fd")) {
          from->fd = std::atoi(fd);
        }
      }
    }
  }
  if (frames.size() <= first) {
    received.refused =
        Refused{std::move(routing_id),
                Rejection{pb::ERROR_MALFORMED, "message has no header frame"},
                pb::Header(), 0};
    return received;
  }
  std::vector<FrameView> views;
  views.reserve(frames.size() - first - 1);
  for (size_t i = first + 1; i < frames.size(); ++i) {
    views.push_back(FrameView{BytesOf(frames[i])});
  }
  Parsed<pb::Header> header = DecodeMessage(BytesOf(frames[first]), views);
  if (!header.ok()) {
    received.refused =
        Refused{std::move(routing_id), std::move(header).rejection(),
                PartialHeader(BytesOf(frames[first])), 0};
    return received;
  }
  Envelope envelope;
  envelope.routing_id = std::move(routing_id);
  // Metadata of the connection; null when no ZAP handler admitted it.
  if (const char* user_id = zmq_msg_gets(frames[first].handle(), "User-Id")) {
    envelope.user_id = user_id;
  }
  envelope.header = std::move(header).value();
  envelope.payload.reserve(frames.size() - first - 1);
  for (size_t i = first + 1; i < frames.size(); ++i) {
    envelope.payload.push_back(std::move(frames[i]));
  }
  received.message = std::move(envelope);
  return received;
}

Status SendError(zmq::socket_t& socket, const pb::Endpoint& self,
                 uint64_t sequence, const Rejection& rejection,
                 uint64_t rejected_sequence, std::string_view routing_id) {
  pb::Header header = MakeHeader(pb::ERROR, self, sequence);
  pb::Error* error = header.mutable_error();
  error->set_code(rejection.code);
  error->set_message(rejection.reason);
  error->set_rejected_sequence(rejected_sequence);
  return SendMessage(socket, header, {}, routing_id);
}

void RefuseMessage(zmq::socket_t& socket, const pb::Endpoint& self,
                   uint64_t sequence, std::string_view routing_id,
                   const pb::Header& header, const Rejection& rejection) {
  // A peer can repeat a refused message as fast as it sends: per kind of
  // refusal (type, code, sender site) the log gets a few lines per window
  // and then a count (ShouldLog; its total budget also holds against a
  // peer that makes up a new site name per message).
  const std::string code = pb::ErrorCode_Name(rejection.code);
  std::string type = pb::MessageType_Name(header.type());
  if (type.empty()) type = "type " + std::to_string(header.type());
  MLOG_EVERY_KEY(ERROR, "rejected " + type + " from " +
                            Sanitized(header.sender().site(), 64) + ": " + code)
      << "rejected " << DescribeHeader(header) << ": " << code << ": "
      << rejection.reason;
  if (header.type() == pb::HEARTBEAT) return;
  if (Status status = SendError(socket, self, sequence, rejection,
                                header.sequence(), routing_id);
      !status.ok()) {
    MLOG_EVERY_KEY(WARNING, "cannot send the error reply: " +
                                std::string(StatusCodeName(status.code())))
        << "cannot send the error reply: " << status;
  }
}

RpcClient::RpcClient(zmq::context_t& context, const std::string& endpoint,
                     pb::Endpoint self, const std::atomic<bool>* cancel,
                     const Clock* clock)
    : context_(context),
      endpoint_(endpoint),
      self_(std::move(self)),
      cancel_(cancel),
      clock_(clock) {}

Status RpcClient::SetCurve(std::string public_key, std::string secret_key,
                           std::string server_public_key) {
  if (!CurveAvailable()) {
    return UnavailableError(
        "this libzmq has no CURVE support (built without libsodium)");
  }
  for (const std::string* key :
       {&public_key, &secret_key, &server_public_key}) {
    if (!IsZ85Key(*key)) {
      return InvalidArgumentError("a CURVE key of the client of '" + endpoint_ +
                                  "' is not a Z85 key");
    }
  }
  curve_ = CurveSettings{std::move(public_key), std::move(secret_key),
                         std::move(server_public_key)};
  Reconnect();
  return Status::Ok();
}

void RpcClient::Connect() {
  socket_.emplace(context_, zmq::socket_type::dealer);
  socket_->set(zmq::sockopt::linger, kSocketCloseLingerMs);
  if (curve_) {
    const CurveKeyPair own{curve_->public_key, curve_->secret_key};
    if (Status status =
            MakeCurveClient(*socket_, own, curve_->server_public_key);
        !status.ok()) {
      // Fail closed: never connect in plaintext instead. SetCurve checked
      // the keys, so this is libzmq refusing them.
      socket_.reset();
      MLOG(ERROR) << "client of '" << endpoint_ << "': " << status;
      errno = EINVAL;
      throw zmq::error_t();
    }
  }
  socket_->connect(endpoint_);
}

void RpcClient::Reconnect() {
  socket_.reset();
  reply_outstanding_ = false;
}

bool RpcClient::IsHeartbeat(const Received& received) {
  return received.message && received.message->header.type() == pb::HEARTBEAT;
}

Status RpcClient::SendRequest(pb::Header* header,
                              std::vector<zmq::message_t> payload) {
  header->set_protocol_version(kProtocolVersion);
  *header->mutable_sender() = self_;
  header->set_sequence(++sequence_);
  MERIDIAN_RETURN_IF_ERROR(SendMessage(*socket_, *header, std::move(payload)));
  last_send_ = clock_->Now();
  return Status::Ok();
}

void RpcClient::HeartbeatIfIdle(const RpcLiveness& liveness) {
  const Duration now = clock_->Now();
  if (last_send_ != Duration::zero() &&
      now - last_send_ < liveness.heartbeat_interval) {
    return;
  }
  try {
    if (!socket_) Connect();
  } catch (const zmq::error_t&) {
    return;  // the next call reports it
  }
  // Sequence 0: heartbeats are outside the request sequence.
  pb::Header heartbeat = MakeHeader(pb::HEARTBEAT, self_, 0);
  heartbeat.mutable_heartbeat();
  if (TrySendMessage(*socket_, heartbeat).ok()) last_send_ = now;
}

Result<Received> RpcClient::AwaitReply(std::chrono::milliseconds timeout,
                                       bool cancellable) {
  // Wait in slices so that a cancellation is noticed promptly.
  constexpr auto kSlice = std::chrono::milliseconds(100);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (cancellable && cancel_ != nullptr && cancel_->load()) {
      return CancelledError("cancelled");
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Received{};
    MERIDIAN_ASSIGN_OR_RETURN(
        Received received,
        ReceiveMessage(*socket_, false, std::min(left, kSlice)));
    if (!received.timed_out() && !IsHeartbeat(received)) return received;
  }
}

uint64_t PayloadBytes(const Envelope& message) {
  uint64_t bytes = 0;
  for (const zmq::message_t& frame : message.payload) bytes += frame.size();
  return bytes;
}

namespace {

bool IsBusy(const Envelope& reply) {
  return reply.header.type() == pb::ERROR &&
         reply.header.error().code() == pb::ERROR_BUSY;
}

}  // namespace

bool RpcClient::PauseAfterBusy(std::chrono::milliseconds* pause) const {
  constexpr auto kLook = std::chrono::milliseconds(20);
  const auto until = std::chrono::steady_clock::now() + *pause;
  while (std::chrono::steady_clock::now() < until) {
    if (cancel_ != nullptr && cancel_->load()) return false;
    std::this_thread::sleep_for(kLook);
  }
  *pause = std::min<std::chrono::milliseconds>(*pause * 2,
                                               std::chrono::seconds(1));
  return true;
}

Result<Envelope> RpcClient::Call(pb::Header header,
                                 std::vector<zmq::message_t> payload,
                                 std::chrono::milliseconds timeout) {
  const bool resendable = payload.empty();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(50);
  while (true) {
    Result<Envelope> reply = CallOnce(header, std::move(payload), timeout);
    if (!resendable || !reply.ok() || !IsBusy(*reply)) return reply;
    if (std::chrono::steady_clock::now() + pause >= deadline ||
        !PauseAfterBusy(&pause)) {
      return reply;
    }
    payload.clear();
    timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
  }
}

Result<Envelope> RpcClient::CallWhileAlive(pb::Header header,
                                           std::vector<zmq::message_t> payload,
                                           const RpcLiveness& liveness) {
  const bool resendable = payload.empty();
  auto pause = std::chrono::milliseconds(50);
  while (true) {
    Result<Envelope> reply =
        CallWhileAliveOnce(header, std::move(payload), liveness);
    if (!resendable || !reply.ok() || !IsBusy(*reply) ||
        !PauseAfterBusy(&pause)) {
      return reply;
    }
    payload.clear();
  }
}

Result<Envelope> RpcClient::CallOnce(pb::Header header,
                                     std::vector<zmq::message_t> payload,
                                     std::chrono::milliseconds timeout) {
  try {
    if (!socket_) Connect();
  } catch (const zmq::error_t& error) {
    return InvalidArgumentError("cannot connect to '" + endpoint_ +
                                "': " + error.what());
  }
  if (reply_outstanding_) {
    // The previous call was cancelled: its reply is still owed to us and
    // must not be taken for this call's. Keeping the connection (and so our
    // identity at the server) matters more than the wait.
    reply_outstanding_ = false;
    MERIDIAN_ASSIGN_OR_RETURN(Received stale, AwaitReply(timeout, false));
    if (stale.timed_out()) socket_.reset();
    if (!socket_) Connect();
  }
  MERIDIAN_RETURN_IF_ERROR(SendRequest(&header, std::move(payload)));
  const std::string request = DescribeHeader(header);
  Result<Received> received = AwaitReply(timeout, true);
  if (!received.ok()) {
    if (received.status().code() == StatusCode::kCancelled) {
      reply_outstanding_ = true;
    }
    return received.status().WithContext("waiting for the reply to " + request);
  }
  if (received->timed_out()) {
    socket_.reset();  // drop the late reply, if any, with the socket
    return DeadlineExceededError("no reply from " + endpoint_ + " to " +
                                 request + " within " +
                                 std::to_string(timeout.count()) + " ms");
  }
  if (received->refused) {
    return DataLossError("malformed reply from " + endpoint_ + " to " +
                         request + ": " + received->refused->rejection.reason);
  }
  return std::move(*received->message);
}

Result<Envelope> RpcClient::CallWhileAliveOnce(
    pb::Header header, std::vector<zmq::message_t> payload,
    const RpcLiveness& liveness) {
  try {
    if (!socket_) Connect();
  } catch (const zmq::error_t& error) {
    return InvalidArgumentError("cannot connect to '" + endpoint_ +
                                "': " + error.what());
  }
  // Up to one wait slice between looks at the cancel flag, the heartbeat
  // due and the silence.
  constexpr auto kSlice = std::chrono::milliseconds(50);
  const Duration stall = liveness.silence_timeout / 4;
  if (reply_outstanding_) {
    // A cancelled call's reply is owed first; wait for it on the same terms
    // (the server may still hold it) and discard it.
    Duration heard = clock_->Now();
    Duration looked = heard;
    while (reply_outstanding_) {
      const Duration now = clock_->Now();
      if (now - looked > stall) heard = now;  // we were stalled, not it
      looked = now;
      if (now - heard > liveness.silence_timeout) {
        Reconnect();
        Connect();
        break;
      }
      HeartbeatIfIdle(liveness);
      MERIDIAN_ASSIGN_OR_RETURN(Received stale,
                                ReceiveMessage(*socket_, false, kSlice));
      if (stale.timed_out()) continue;
      heard = clock_->Now();
      if (!IsHeartbeat(stale)) reply_outstanding_ = false;
    }
  }
  MERIDIAN_RETURN_IF_ERROR(SendRequest(&header, std::move(payload)));
  const std::string request = DescribeHeader(header);
  Duration heard = clock_->Now();  // the server counts as alive at the send
  Duration looked = heard;
  while (true) {
    if (cancel_ != nullptr && cancel_->load()) {
      reply_outstanding_ = true;
      return CancelledError("cancelled")
          .WithContext("waiting for the reply to " + request);
    }
    const Duration now = clock_->Now();
    if (now - looked > stall) heard = now;
    looked = now;
    if (now - heard > liveness.silence_timeout) {
      Reconnect();  // a late reply must not answer a later call
      char silent[32];
      std::snprintf(silent, sizeof(silent), "%.1f", ToSeconds(now - heard));
      return DeadlineExceededError(
          "nothing from " + endpoint_ + " for " + silent +
          " s while waiting for the reply to " + request);
    }
    HeartbeatIfIdle(liveness);
    Result<Received> received = ReceiveMessage(*socket_, false, kSlice);
    if (!received.ok()) {
      return received.status().WithContext("waiting for the reply to " +
                                           request);
    }
    if (received->timed_out()) continue;
    heard = clock_->Now();
    if (IsHeartbeat(*received)) continue;  // alive, still holding our reply
    if (received->refused) {
      return DataLossError("malformed reply from " + endpoint_ + " to " +
                           request + ": " +
                           received->refused->rejection.reason);
    }
    return std::move(*received->message);
  }
}

Result<std::string> BoundEndpoint(zmq::socket_t& socket) {
  try {
    return socket.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& error) {
    return FromZmqError(error, "reading the bound endpoint");
  }
}

}  // namespace meridian
