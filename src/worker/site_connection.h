// A worker's link to its site server: the probe until the server answers,
// HELLO until WELCOME (a join, and a rejoin as the same process over a new
// connection, with backoff, when the server is gone or does not know the
// connection), requests while the server shows it is alive (heartbeats
// both ways, see RpcLiveness), and BYE.
//
// Ownership and threads: owned by Worker::Impl and driven by the worker's
// thread alone. It owns the ZeroMQ context and the RpcClient (one request
// outstanding at a time). Size: fixed.
#ifndef MERIDIAN_WORKER_SITE_CONNECTION_H_
#define MERIDIAN_WORKER_SITE_CONNECTION_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "meridian/core/clock.h"
#include "meridian/core/layout.h"
#include "meridian/core/status.h"
#include "meridian/net/security.h"
#include "meridian/net/transport.h"
#include "meridian/worker/worker.h"

namespace meridian {

class SiteConnection {
 public:
  // The worker `options.index` of site `site_index` of `options.job`,
  // whose model has `layout` (sent with HELLO, checked against WELCOME).
  // `clock` (not owned) times the liveness rules and backoffs.
  SiteConnection(const WorkerOptions& options, int site_index,
                 const ModelLayout& layout, Clock* clock,
                 const WorkerTimeouts& timeouts);
  SiteConnection(const SiteConnection&) = delete;
  SiteConnection& operator=(const SiteConnection&) = delete;

  // The server this worker commits to: its site's own, or the one its
  // server_site names (WorkerOptions::connect overrides).
  const std::string& endpoint() const { return endpoint_; }
  // This process's identity at the site (HELLO.incarnation).
  uint64_t incarnation() const { return incarnation_; }
  // Times the worker joined again (Rejoin).
  uint64_t rejoins() const { return rejoins_; }

  // Makes the connection to the server a CURVE client with `keys`.
  Status Secure(const WorkerCurveKeys& keys);

  // Probes the site server until it answers, waiting 1, 2, 4 ... 30 s for
  // each answer and logging every miss; any reply (even an ERROR) means it
  // is up. Returns Cancelled when a stop is requested meanwhile.
  Status AwaitServer();
  // HELLO, and the server's answer once training starts (it holds the
  // HELLO until then and sends HEARTBEATs meanwhile): a WELCOME, an ERROR
  // or a MODEL that says stop. When the server stays silent, rejoins
  // (Rejoin); errors as Rejoin's.
  Result<Envelope> Join();
  // A reply to HELLO must be a WELCOME for this worker's model.
  Status CheckWelcome(const Envelope& reply) const;
  // The site server is gone (`why`), or does not know this connection:
  // joins again as the same process over a new connection, with backoff,
  // until a WELCOME (returned, checked). Gives up after give_up_s without
  // hearing from the server since `absent_since`; Cancelled when a stop is
  // requested; a refusal (another process took the index, the job is over
  // for new processes ...) is an error.
  Result<Envelope> Rejoin(const std::string& why, Duration absent_since);
  // Why an answer calls for a rejoin: the server was silent (no reply, no
  // heartbeat) or does not know this connection (it restarted, declared
  // this worker dead, or ZeroMQ reconnected underneath). Empty: it does
  // not.
  static std::string RejoinReason(const Result<Envelope>& reply);
  // When the server was last heard from, given that it has just been
  // silent for the whole timeout.
  Duration ServerSilentSince() const;

  // A request, answered while the server is alive (RpcClient::
  // CallWhileAlive).
  Result<Envelope> Call(pb::Header header,
                        std::vector<zmq::message_t> frames = {});
  // Between training steps: a HEARTBEAT if nothing went out for an
  // interval (never blocks).
  void HeartbeatIfIdle() { client_.HeartbeatIfIdle(liveness_); }
  // Says BYE with the worker's `stats`, best effort and not cancellable
  // (the worker may be leaving because of a signal; the server may be
  // gone already).
  void Leave(const pb::WorkerStats& stats, const std::string& reason);

 private:
  pb::Header Hello() const;
  bool StopRequested() const {
    return stop_requested_ != nullptr &&
           stop_requested_->load(std::memory_order_relaxed);
  }

  const ModelLayout& layout_;
  Clock* const clock_;
  const WorkerTimeouts timeouts_;
  RpcLiveness liveness_;  // from timeouts_
  const uint32_t index_;  // the worker's index inside its site
  const uint64_t incarnation_;
  const std::string endpoint_;
  const std::string server_name_;  // the serving site, for log lines
  const std::atomic<bool>* const stop_requested_;  // may be null
  uint64_t rejoins_ = 0;
  zmq::context_t context_;
  RpcClient client_;
};

}  // namespace meridian

#endif  // MERIDIAN_WORKER_SITE_CONNECTION_H_
