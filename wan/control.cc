// The ZeroMQ half of the control protocol: the handler, the REP server and
// the REQ client, and the presentation of replies.
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <thread>
#include <zmq.hpp>

#include "meridian/core/log.h"
#include "meridian/core/socket_close.h"
#include "meridian/wan/control.h"
#include "meridian/wan/units.h"
#include "wan/emulator.h"

namespace meridian::wan {
namespace {

pb::WanControlReply Refuse(const Emulator& emulator, const Status& status) {
  pb::WanControlReply reply;
  reply.set_ok(false);
  reply.set_error(status.message().empty() ? status.ToString()
                                           : status.message());
  reply.set_uptime_s(emulator.UptimeSeconds());
  return reply;
}

// "tcp://host:0" -> "tcp://host:*" (ZeroMQ's spelling of "any port").
std::string ZmqBindEndpoint(std::string endpoint) {
  if (endpoint.size() > 2 &&
      endpoint.compare(endpoint.size() - 2, 2, ":0") == 0 &&
      endpoint.rfind("tcp://", 0) == 0) {
    endpoint.replace(endpoint.size() - 1, 1, "*");
  }
  return endpoint;
}

}  // namespace

pb::WanControlReply HandleControlRequest(Emulator& emulator,
                                         const pb::WanControlRequest& request) {
  if (Status valid = ValidateControlRequest(request); !valid.ok()) {
    return Refuse(emulator, valid);
  }
  pb::WanControlReply reply;
  std::string touched;
  switch (request.command_case()) {
    case pb::WanControlRequest::kSet: {
      const pb::WanSetLink& set = request.set();
      Status status =
          emulator.SetLink(set.link(), set.direction(), set.change());
      if (!status.ok()) return Refuse(emulator, status);
      touched = set.link();
      break;
    }
    case pb::WanControlRequest::kPartition: {
      Status status = emulator.Partition(request.partition().link());
      if (!status.ok()) return Refuse(emulator, status);
      touched = request.partition().link();
      break;
    }
    case pb::WanControlRequest::kHeal: {
      Status status = emulator.Heal(request.heal().link());
      if (!status.ok()) return Refuse(emulator, status);
      touched = request.heal().link();
      break;
    }
    case pb::WanControlRequest::kReset: {
      Status status = emulator.ResetConnections(request.reset().link());
      if (!status.ok()) return Refuse(emulator, status);
      touched = request.reset().link();
      break;
    }
    case pb::WanControlRequest::kAddRoute: {
      const pb::WanAddRoute& route = request.add_route();
      Result<std::string> bound = emulator.AddRoute(RouteSpec{
          route.link(), route.from_site(), route.listen(), route.forward()});
      if (!bound.ok()) return Refuse(emulator, bound.status());
      reply.set_listen(*bound);
      touched = route.link();
      break;
    }
    case pb::WanControlRequest::kStatus:
      for (pb::WanLinkState& state : emulator.LinkStates()) {
        *reply.add_links() = std::move(state);
      }
      break;
    case pb::WanControlRequest::COMMAND_NOT_SET:
      return Refuse(emulator, InvalidArgumentError("no command"));
  }
  if (!touched.empty()) {
    Result<pb::WanLinkState> state = emulator.LinkState(touched);
    if (state.ok()) *reply.add_links() = std::move(*state);
  }
  reply.set_ok(true);
  reply.set_uptime_s(emulator.UptimeSeconds());
  return reply;
}

// ---- server ----------------------------------------------------------------

class ControlServer::Impl {
 public:
  explicit Impl(Emulator* emulator)
      : emulator_(emulator), socket_(context_, ZMQ_REP) {}

  ~Impl() { Stop(); }

  Status Bind(const std::string& endpoint) {
    try {
      socket_.set(zmq::sockopt::linger, kSocketCloseLingerMs);
      socket_.bind(ZmqBindEndpoint(endpoint));
      endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& error) {
      return UnavailableError("cannot bind the control endpoint '" + endpoint +
                              "': " + error.what());
    }
    thread_ = std::thread([this] { Serve(); });
    return Status::Ok();
  }

  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

  const std::string& endpoint() const { return endpoint_; }
  uint64_t served() const { return served_.load(); }

 private:
  void Serve() {
    while (!stop_.load()) {
      try {
        zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) <= 0) continue;
        std::vector<zmq::message_t> parts;
        do {
          zmq::message_t part;
          if (!socket_.recv(part, zmq::recv_flags::none)) break;
          parts.push_back(std::move(part));
        } while (socket_.get(zmq::sockopt::rcvmore));
        pb::WanControlReply reply;
        if (parts.size() != 1) {
          reply = Refuse(
              *emulator_,
              InvalidArgumentError("a control request is one frame, got " +
                                   std::to_string(parts.size())));
        } else {
          Result<pb::WanControlRequest> request = DecodeControlRequest(
              {static_cast<const uint8_t*>(parts[0].data()), parts[0].size()});
          if (!request.ok()) {
            reply = Refuse(*emulator_, request.status());
          } else {
            reply = HandleControlRequest(*emulator_, *request);
          }
        }
        if (!reply.ok()) {
          MLOG(WARNING) << "control request refused: " << reply.error();
        }
        const std::string bytes = reply.SerializeAsString();
        // Counted before the reply leaves, so a client that has its reply
        // sees the count include it.
        served_.fetch_add(1);
        socket_.send(zmq::buffer(bytes), zmq::send_flags::none);
      } catch (const zmq::error_t& error) {
        if (error.num() == ETERM) return;
        MLOG(WARNING) << "control endpoint: " << error.what();
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }

  // Threads: the owner's thread runs Bind, Stop and the accessors; thread_
  // runs Serve. Nothing is shared under a lock: socket_ is thread_'s alone
  // once it runs, endpoint_ is fixed before it starts, the emulator is
  // thread-safe, and stop_ and served_ are atomic.
  Emulator* emulator_;
  zmq::context_t context_;
  zmq::socket_t socket_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> served_{0};
  std::thread thread_;
};

ControlServer::ControlServer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
ControlServer::~ControlServer() { Stop(); }

Result<std::unique_ptr<ControlServer>> ControlServer::Start(
    Emulator* emulator, std::string endpoint) {
  std::unique_ptr<Impl> impl;
  try {
    impl = std::make_unique<Impl>(emulator);
  } catch (const zmq::error_t& error) {
    return InternalError(std::string("zmq: ") + error.what());
  }
  MERIDIAN_RETURN_IF_ERROR(impl->Bind(endpoint));
  return std::unique_ptr<ControlServer>(new ControlServer(std::move(impl)));
}

const std::string& ControlServer::endpoint() const { return impl_->endpoint(); }
uint64_t ControlServer::requests_served() const { return impl_->served(); }
void ControlServer::Stop() { impl_->Stop(); }

// ---- client ----------------------------------------------------------------

class ControlClient::Socket {
 public:
  Socket(const std::string& endpoint, Duration timeout)
      : socket(context, ZMQ_REQ) {
    const int ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count());
    socket.set(zmq::sockopt::linger, kSocketCloseLingerMs);
    socket.set(zmq::sockopt::sndtimeo, ms);
    socket.set(zmq::sockopt::rcvtimeo, ms);
    socket.connect(endpoint);
  }
  zmq::context_t context;
  zmq::socket_t socket;
};

ControlClient::ControlClient(std::string endpoint, Duration timeout)
    : endpoint_(std::move(endpoint)), timeout_(timeout) {}
ControlClient::~ControlClient() = default;

Result<pb::WanControlReply> ControlClient::Call(pb::WanControlRequest request) {
  if (request.protocol_version() == 0) {
    request.set_protocol_version(kWanControlProtocolVersion);
  }
  try {
    if (!socket_) socket_ = std::make_unique<Socket>(endpoint_, timeout_);
    const std::string bytes = request.SerializeAsString();
    if (!socket_->socket.send(zmq::buffer(bytes), zmq::send_flags::none)) {
      socket_.reset();
      return UnavailableError("wanem at " + endpoint_ +
                              " does not take requests");
    }
    zmq::message_t answer;
    if (!socket_->socket.recv(answer, zmq::recv_flags::none)) {
      socket_.reset();  // a REQ socket cannot send again before a reply
      return DeadlineExceededError("no answer from wanem at " + endpoint_ +
                                   " within " + FormatDuration(timeout_) +
                                   " (is it running?)");
    }
    pb::WanControlReply reply;
    if (!reply.ParseFromArray(answer.data(), static_cast<int>(answer.size()))) {
      return DataLossError("wanem at " + endpoint_ +
                           " sent a reply that does not parse");
    }
    return reply;
  } catch (const zmq::error_t& error) {
    socket_.reset();
    return UnavailableError("wanem control endpoint '" + endpoint_ +
                            "': " + error.what());
  }
}

Status ReplyStatus(const pb::WanControlReply& reply) {
  if (reply.ok()) return Status::Ok();
  return FailedPreconditionError("wanem refused: " + reply.error());
}

Result<pb::WanControlReply> ControlClient::GetStatus() {
  MERIDIAN_ASSIGN_OR_RETURN(pb::WanControlReply reply,
                            Call(MakeStatusRequest()));
  MERIDIAN_RETURN_IF_ERROR(ReplyStatus(reply));
  return reply;
}

Result<std::string> ControlClient::AddRoute(std::string_view link,
                                            std::string_view from_site,
                                            std::string_view listen,
                                            std::string_view forward) {
  MERIDIAN_ASSIGN_OR_RETURN(
      pb::WanControlReply reply,
      Call(MakeAddRouteRequest(link, from_site, listen, forward)));
  MERIDIAN_RETURN_IF_ERROR(ReplyStatus(reply));
  return reply.listen();
}

Status ControlClient::Partition(std::string_view link) {
  MERIDIAN_ASSIGN_OR_RETURN(pb::WanControlReply reply,
                            Call(MakePartitionRequest(link)));
  return ReplyStatus(reply);
}

Status ControlClient::Heal(std::string_view link) {
  MERIDIAN_ASSIGN_OR_RETURN(pb::WanControlReply reply,
                            Call(MakeHealRequest(link)));
  return ReplyStatus(reply);
}

Status ControlClient::Reset(std::string_view link) {
  MERIDIAN_ASSIGN_OR_RETURN(pb::WanControlReply reply,
                            Call(MakeResetRequest(link)));
  return ReplyStatus(reply);
}

Status ControlClient::Set(std::string_view link, pb::LinkDirection direction,
                          const pb::LinkDirectionConfig& change) {
  pb::WanControlRequest request;
  pb::WanSetLink* set = request.mutable_set();
  set->set_link(std::string(link));
  set->set_direction(direction);
  *set->mutable_change() = change;
  MERIDIAN_ASSIGN_OR_RETURN(pb::WanControlReply reply, Call(request));
  return ReplyStatus(reply);
}

// ---- presentation ----------------------------------------------------------

namespace {

void AppendDirectionRow(const std::string& link, bool partitioned,
                        const pb::WanDirectionState& d, std::string* out) {
  char line[512];
  std::string model = FormatBandwidth(d.bandwidth_bps()) + " " +
                      FormatDuration(FromSeconds(d.latency_s()));
  if (d.jitter_s() > 0) {
    model +=
        " +-" + FormatDuration(FromSeconds(d.jitter_s())) +
        (d.jitter_distribution() == pb::JITTER_NORMAL ? " normal" : " uniform");
  }
  const std::string direction = d.from_site() + "->" + d.to_site();
  std::snprintf(line, sizeof(line),
                "%-20s %-24s %-30s %-5s %14" PRIu64 " %10" PRIu64 " %12s\n",
                link.c_str(), direction.c_str(), model.c_str(),
                partitioned ? "yes" : "no", d.bytes(), d.messages(),
                FormatBytes(d.queued_bytes()).c_str());
  *out += line;
}

}  // namespace

std::string FormatLinkStates(const pb::WanControlReply& reply) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line), "wanem up %.1f s, %d links\n",
                reply.uptime_s(), reply.links_size());
  out += line;
  std::snprintf(line, sizeof(line), "%-20s %-24s %-30s %-5s %14s %10s %12s\n",
                "link", "direction", "model", "part.", "bytes", "messages",
                "queued");
  out += line;
  for (const pb::WanLinkState& link : reply.links()) {
    AppendDirectionRow(link.link(), link.partitioned(), link.a_to_b(), &out);
    AppendDirectionRow(link.link(), link.partitioned(), link.b_to_a(), &out);
    for (const pb::WanRouteState& route : link.routes()) {
      out += "    route from " + route.from_site() + ": " + route.listen() +
             " -> " + route.forward() + " (" +
             std::to_string(route.connections()) + " open)\n";
    }
  }
  return out;
}

std::vector<pb::LinkTraffic> LinkTrafficFromReply(
    const pb::WanControlReply& reply) {
  std::vector<pb::LinkTraffic> traffic;
  for (const pb::WanLinkState& link : reply.links()) {
    for (const pb::WanDirectionState* d : {&link.a_to_b(), &link.b_to_a()}) {
      pb::LinkTraffic t;
      t.set_link(link.link());
      t.set_from_site(d->from_site());
      t.set_to_site(d->to_site());
      t.set_bytes(static_cast<double>(d->bytes()));
      t.set_messages(static_cast<double>(d->messages()));
      t.set_bandwidth_bps(d->bandwidth_bps());
      t.set_latency_s(d->latency_s());
      traffic.push_back(std::move(t));
    }
  }
  return traffic;
}

std::string TrafficCsvRows(double t_s, const pb::WanControlReply& reply) {
  std::string out;
  char line[512];
  for (const pb::WanLinkState& link : reply.links()) {
    for (const pb::WanDirectionState* d : {&link.a_to_b(), &link.b_to_a()}) {
      std::snprintf(
          line, sizeof(line),
          "%.3f,%s,%s,%s,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%.0f,%.6f,%d\n",
          t_s, link.link().c_str(), d->from_site().c_str(),
          d->to_site().c_str(), d->bytes(), d->messages(), d->queued_bytes(),
          d->bandwidth_bps(), d->latency_s(), link.partitioned() ? 1 : 0);
      out += line;
    }
  }
  return out;
}

}  // namespace meridian::wan
