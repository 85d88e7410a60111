// The parameter server of one site: owns the site's model replica (all
// shards), admits its workers, applies their commits under the intra-site
// policy, answers pulls, and evaluates the model on the test set on a fixed
// period in a thread that never blocks commits. Workers may die, come back,
// be restarted or join late (fault { }): a silent worker is declared dead
// and training goes on with the others; a commit sent again after a
// reconnect is applied once.
#ifndef MERIDIAN_SITE_SITE_SERVER_H_
#define MERIDIAN_SITE_SITE_SERVER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meridian/core/clock.h"
#include "meridian/job.pb.h"
#include "meridian/core/layout.h"
#include "meridian/report.pb.h"
#include "meridian/core/status.h"

namespace meridian {

// How long the site server waits before it acts, in seconds.
struct SiteServerTimeouts {
  // A HEARTBEAT to each worker whose reply it holds, this often.
  double heartbeat_interval_s = 1;
  // A live worker silent this long is declared dead.
  double worker_timeout_s = 10;
  // Training starts when every worker joined, or after this long with at
  // least min_workers (the rest may join late).
  double join_timeout_s = 60;
  uint32_t min_workers = 1;
  // After the job ends: how long live workers get to say BYE.
  double drain_s = 5;

  // The job's fault { } and server.join_timeout_s; invalid values (not
  // positive, not finite) fall back to the defaults above.
  static SiteServerTimeouts FromJob(const pb::JobConfig& job);
};

struct SiteServerOptions {
  pb::JobConfig job;  // validated
  std::string site;   // name of this site in job.site()
  // ZeroMQ endpoint to bind; empty: the site's address from the job.
  std::string bind;
  // Endpoint of the socket peer sites send their updates to; empty: the
  // site's mirror_address from the job.
  std::string mirror_bind;
  // With security.curve on: the site's CURVE secret key file (mode 0600);
  // empty: $MERIDIAN_SECRET_KEY, else <security.key_dir>/<site>.key.
  std::string secret_key_file;
  // When set, the server writes <out_dir>/site-<name>.json (a SiteSummary)
  // on exit.
  std::string out_dir;
  // "HOST:PORT" of the metrics endpoint (port 0: any free port); empty:
  // the site's metrics_address from the job; "none" (or both empty): no
  // endpoint. A bind failure is logged and the site runs without one.
  std::string metrics_address;
  // Polled by the event loop; when it becomes true the server finishes the
  // job as if the time budget ran out. May be null. Not owned.
  const std::atomic<bool>* stop_requested = nullptr;
  // Time: the event loop's clock (timeouts, training time, rates) and the
  // wall clock of fault events. Not owned; must outlive the server.
  Clock* clock = SystemClock();
  const WallClock* wall_clock = SystemWallClock();
  // Unset: SiteServerTimeouts::FromJob(job).
  std::optional<SiteServerTimeouts> timeouts;
  // Checkpoints (job.fault.checkpoint_period_s): where this site keeps
  // them; empty: fault.checkpoint_dir, else <out_dir>/checkpoints/<site>,
  // else none.
  std::string checkpoint_dir;
  // Continue from the newest checkpoint in checkpoint_dir when there is
  // one (a restart after a crash, `meridian run --resume`). Without it, a
  // checkpoint directory that holds checkpoints is refused: they belong to
  // an earlier run.
  bool resume = false;
  // Training does not start before a SET_PEERS has said where the peer
  // sites listen. `meridian run` passes it (`--await-peers`): it routes
  // every link through wanem, and a restarted server whose workers come
  // back at once must not open its channels to the job's direct mirror
  // addresses first. Ignored when the site syncs with nobody.
  bool await_peers = false;
  // The job's control token: SHUTDOWN and SET_PEERS are obeyed only when
  // they carry it (Header.control_token). Empty: no control message is
  // obeyed (the operator stops the server with a signal). `meridian site`
  // reads it from --control-token-file or $MERIDIAN_CONTROL_TOKEN.
  std::string control_token;
};

// The bounds of the worker endpoint (job.server.limits) with the defaults
// filled in from `layout`: what one connection may make the server hold.
struct EndpointBounds {
  uint64_t max_frame_bytes = 0;   // ZMQ_MAXMSGSIZE of the worker socket
  uint64_t max_reply_floats = 0;  // floats one reply may carry
  uint32_t send_queue = 0;        // ZMQ_SNDHWM, messages per connection
  uint32_t receive_queue = 0;     // ZMQ_RCVHWM, messages per connection
  // The front of a tcp:// endpoint (wan/front.h): connections, credits
  // before and after a worker joined, and the stall timeout.
  uint32_t max_connections = 0;
  uint64_t untrusted_connection_bytes = 0;
  uint64_t trusted_connection_bytes = 0;
  double connection_stall_s = 0;
  double untrusted_messages_per_s = 0;

  static EndpointBounds FromConfig(const pb::EndpointLimits& limits,
                                   const ModelLayout& layout);
  // What ZeroMQ may hold for one connection at most: its queues full of
  // messages of the largest allowed size (a message is at most a header
  // and one frame per tensor). For the memory formula of docs/operations.md ("The worker endpoint").
  uint64_t PerConnectionBytes(const ModelLayout& layout) const;
  // The largest message a worker may send: a header and a frame per
  // tensor, each within max_frame_bytes.
  uint64_t LargestMessageBytes(const ModelLayout& layout) const;
};

class SiteServer {
 public:
  // Loads the test set (and the training images' statistics), builds the
  // model with its seeded initial parameters and binds the socket. Errors
  // name what is wrong (missing data files, an address in use...).
  static Result<std::unique_ptr<SiteServer>> Create(SiteServerOptions options);
  ~SiteServer();
  SiteServer(const SiteServer&) = delete;
  SiteServer& operator=(const SiteServer&) = delete;

  // The endpoint workers connect to (port resolved when bound to "*").
  const std::string& endpoint() const;
  // The endpoint peer sites send to; empty when the site syncs with nobody.
  std::string mirror_endpoint() const;
  // The metrics endpoint's bound "HOST:PORT"; empty without one.
  std::string metrics_address() const;

  // Serves until the job ends: the target accuracy is reached, the time
  // budget runs out, a SHUTDOWN arrives, stop_requested is set or every
  // worker said BYE. Then it tells every worker to stop, waits briefly for
  // their BYE, runs a final evaluation and writes the summary. Returns an
  // error only when the site could not run (fewer than min_workers joined
  // within the join timeout). Call once.
  Status Run();

  // Valid after Run() returned.
  const pb::SiteSummary& summary() const;

  // A copy of the site's current model (thread-safe; after Run() returned,
  // the final model).
  std::vector<float> Snapshot() const;

 private:
  class Impl;
  explicit SiteServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_SITE_SERVER_H_
