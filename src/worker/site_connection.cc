#include "worker/site_connection.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "meridian/config/config.h"
#include "meridian/core/format.h"
#include "meridian/core/log.h"
#include "meridian/net/message.h"
#include "meridian/sync/addresses.h"

namespace meridian {
namespace {

// Backoff while the site server does not answer yet (it may start after
// the worker when roles are started by hand or in containers), and between
// HELLOs of a rejoin.
constexpr auto kFirstProbeWait = std::chrono::seconds(1);
constexpr auto kMaxProbeWait = std::chrono::seconds(30);

// A random non-zero number that differs between processes (HELLO's
// incarnation).
uint64_t RandomIncarnation() {
  std::random_device device;
  std::seed_seq seed{
      device(), device(), static_cast<unsigned>(::getpid()),
      static_cast<unsigned>(
          std::chrono::steady_clock::now().time_since_epoch().count())};
  std::mt19937_64 rng(seed);
  uint64_t value = 0;
  while (value == 0) value = rng();
  return value;
}

pb::Endpoint SelfEndpoint(const pb::SiteConfig& site, uint32_t index) {
  pb::Endpoint self;
  self.set_site(site.name());
  self.set_role(pb::ROLE_WORKER);
  self.set_id(index);
  return self;
}

}  // namespace

SiteConnection::SiteConnection(const WorkerOptions& options, int site_index,
                               const ModelLayout& layout, Clock* clock,
                               const WorkerTimeouts& timeouts)
    : layout_(layout),
      clock_(clock),
      timeouts_(timeouts),
      index_(options.index),
      incarnation_(options.incarnation != 0 ? options.incarnation
                                            : RandomIncarnation()),
      endpoint_(options.connect.empty()
                    ? WorkerServerEndpoint(options.job, site_index)
                    : options.connect),
      server_name_(
          options.job.site(ServingSite(options.job, site_index)).name()),
      stop_requested_(options.stop_requested),
      client_(context_, endpoint_,
              SelfEndpoint(options.job.site(site_index), options.index),
              options.stop_requested, clock) {
  liveness_.heartbeat_interval = FromSeconds(timeouts_.heartbeat_interval_s);
  liveness_.silence_timeout = FromSeconds(timeouts_.server_timeout_s);
}

Status SiteConnection::Secure(const WorkerCurveKeys& keys) {
  return client_.SetCurve(keys.own.public_key, keys.own.secret_key,
                          keys.server_public_key);
}

Status SiteConnection::AwaitServer() {
  std::chrono::milliseconds wait = kFirstProbeWait;
  for (int attempt = 1;; ++attempt) {
    pb::Header probe;
    probe.set_type(pb::STATUS_REQUEST);
    Result<Envelope> reply = client_.Call(probe, {}, wait);
    if (reply.ok()) {
      if (attempt > 1) MLOG(INFO) << "site server at " << endpoint_ << " is up";
      return Status::Ok();
    }
    if (reply.status().code() == StatusCode::kCancelled || StopRequested()) {
      return CancelledError("stopped while waiting for the site server");
    }
    const auto next =
        std::min<std::chrono::milliseconds>(wait * 2, kMaxProbeWait);
    MLOG(WARNING) << "waiting for site server '" << server_name_ << "' at "
                  << endpoint_ << ": no answer within " << wait.count() / 1000.0
                  << " s (attempt " << attempt << "; next wait "
                  << next.count() / 1000.0 << " s)";
    wait = next;
  }
}

pb::Header SiteConnection::Hello() const {
  pb::Header hello;
  hello.set_type(pb::HELLO);
  hello.mutable_hello()->set_worker_index(index_);
  hello.mutable_hello()->set_incarnation(incarnation_);
  LayoutToSpecs(layout_, hello.mutable_hello()->mutable_layout());
  return hello;
}

Result<Envelope> SiteConnection::Join() {
  Result<Envelope> reply = client_.CallWhileAlive(Hello(), {}, liveness_);
  if (!reply.ok() && reply.status().code() == StatusCode::kDeadlineExceeded) {
    reply = Rejoin(reply.status().message(), ServerSilentSince());
  }
  return reply;
}

Status SiteConnection::CheckWelcome(const Envelope& reply) const {
  if (reply.header.type() == pb::ERROR) {
    return FailedPreconditionError("site server refused the worker: " +
                                   reply.header.error().message());
  }
  if (reply.header.type() != pb::WELCOME) {
    return DataLossError("expected WELCOME, got " +
                         DescribeHeader(reply.header));
  }
  MERIDIAN_ASSIGN_OR_RETURN(ModelLayout layout,
                            LayoutFromSpecs(reply.header.welcome().layout()));
  if (!(layout == layout_)) {
    return FailedPreconditionError(
        "site server's model [" + layout.DebugString() +
        "] differs from this worker's [" + layout_.DebugString() + "]");
  }
  return Status::Ok();
}

Duration SiteConnection::ServerSilentSince() const {
  return clock_->Now() - liveness_.silence_timeout;
}

Result<Envelope> SiteConnection::Rejoin(const std::string& why,
                                        Duration absent_since) {
  ++rejoins_;
  MLOG(WARNING) << "site server gone: " << why
                << "; joining again as the same process";
  Duration wait =
      std::min<Duration>(kFirstProbeWait, liveness_.silence_timeout);
  const Duration max_wait =
      std::max<Duration>(kMaxProbeWait, liveness_.silence_timeout);
  for (int attempt = 1;; ++attempt) {
    if (StopRequested()) {
      return CancelledError("stopped while rejoining the site server");
    }
    const double absent_s = ToSeconds(clock_->Now() - absent_since);
    if (timeouts_.give_up_s > 0 && absent_s > timeouts_.give_up_s) {
      return UnavailableError("site server at " + endpoint_ + " gone for " +
                              FormatSeconds(absent_s) +
                              " s; giving up (fault.worker_give_up_s = " +
                              FormatSeconds(timeouts_.give_up_s) + ")");
    }
    // A new connection: the old one may be broken for good, and whatever
    // it still owes us must not be taken for the WELCOME.
    client_.Reconnect();
    RpcLiveness liveness = liveness_;
    liveness.silence_timeout = wait;
    Result<Envelope> reply = client_.CallWhileAlive(Hello(), {}, liveness);
    if (reply.ok()) {
      MERIDIAN_RETURN_IF_ERROR(CheckWelcome(*reply));
      MLOG(INFO) << "rejoined the site server after " << FormatSeconds(absent_s)
                 << " s (attempt " << attempt << "); it applied this "
                 << "process's commits up to id "
                 << reply->header.welcome().last_commit_id();
      return reply;
    }
    if (reply.status().code() == StatusCode::kCancelled) {
      return reply.status();
    }
    if (reply.status().code() != StatusCode::kDeadlineExceeded) {
      // Not even sent (e.g. the endpoint cannot be resolved yet): wait out
      // this attempt's time before the next.
      clock_->SleepFor(wait);
    }
    MLOG(WARNING) << "no WELCOME from the site server at " << endpoint_
                  << " (attempt " << attempt << ", " << FormatSeconds(absent_s)
                  << " s gone): " << reply.status().message();
    wait = std::min(wait * 2, max_wait);
  }
}

std::string SiteConnection::RejoinReason(const Result<Envelope>& reply) {
  if (!reply.ok()) {
    return reply.status().code() == StatusCode::kDeadlineExceeded
               ? reply.status().message()
               : std::string();
  }
  if (reply->header.type() == pb::ERROR &&
      reply->header.error().code() == pb::ERROR_UNKNOWN_SENDER) {
    return "it does not know this connection: " +
           reply->header.error().message();
  }
  return std::string();
}

Result<Envelope> SiteConnection::Call(pb::Header header,
                                      std::vector<zmq::message_t> frames) {
  return client_.CallWhileAlive(std::move(header), std::move(frames),
                                liveness_);
}

void SiteConnection::Leave(const pb::WorkerStats& stats,
                           const std::string& reason) {
  MLOG(INFO) << "leaving (" << reason << ") after " << stats.steps()
             << " steps and " << stats.commits() << " commits";
  pb::Header bye;
  bye.set_type(pb::BYE);
  *bye.mutable_bye()->mutable_stats() = stats;
  client_.set_cancel(nullptr);
  Result<Envelope> ack = client_.Call(bye, {}, std::chrono::seconds(5));
  if (!ack.ok()) MLOG(WARNING) << "no BYE acknowledgement: " << ack.status();
}

}  // namespace meridian
