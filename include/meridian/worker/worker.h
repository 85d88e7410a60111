// A worker: trains on its share of its site's data and commits its
// accumulated change to the site server as the server's plan says.
//
// Faults. Any process may die at any moment; what a worker's work is worth
// then:
//   - A commit the site answered is in the site's model exactly once.
//   - A commit sent and not answered when the worker or its connection dies
//     is applied whole if the site received it (one ZeroMQ message: never
//     half-applied), and is lost otherwise. A worker that comes back (the
//     same process) learns which from WELCOME.last_commit_id and sends it
//     again if it was not applied; a restarted process cannot, so that
//     commit is lost compute.
//   - Local steps since the last commit are lost compute when the process
//     dies: a restarted process starts from the site's current model.
// The site server is taken for gone after fault.server_timeout_s without a
// reply or a HEARTBEAT from it (it sends them while it holds the reply, so
// a worker held by a barrier or the clock-skew bound waits as long as it
// takes). The worker then rejoins: a new connection and HELLO with the same
// incarnation, with backoff, until WELCOME; it gives up after
// fault.worker_give_up_s of absence (0: never). Meanwhile, and between
// training steps, it sends a HEARTBEAT whenever it has sent nothing for
// fault.heartbeat_interval_s, so that the site does not declare it dead.
#ifndef MERIDIAN_WORKER_WORKER_H_
#define MERIDIAN_WORKER_WORKER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "meridian/core/clock.h"
#include "meridian/job.pb.h"
#include "meridian/core/status.h"
#include "meridian/wire.pb.h"

namespace meridian {

// How long a worker waits before it acts, in seconds.
struct WorkerTimeouts {
  // A HEARTBEAT when nothing else went out for this long.
  double heartbeat_interval_s = 1;
  // The site server is gone after this long without a message from it.
  double server_timeout_s = 10;
  // ... and the worker gives up (an error) after this long without one
  // (0: never).
  double give_up_s = 600;

  // The job's fault { }; invalid values fall back to the defaults above.
  static WorkerTimeouts FromJob(const pb::JobConfig& job);
};

struct WorkerOptions {
  pb::JobConfig job;   // validated
  std::string site;    // name of the worker's site
  uint32_t index = 0;  // worker index inside the site
  // Compute threads (MakeJobModelOnThreads); 0: its group's
  // workers.threads.
  uint32_t threads = 0;
  // Site server endpoint; empty: the site's address from the job.
  std::string connect;
  // "HOST:PORT" of the worker's own metrics endpoint; empty or "none": no
  // endpoint (the default: the site server exports every worker's counts).
  std::string metrics_address;
  // When it becomes true the worker leaves (BYE) after its current step.
  // May be null. Not owned.
  const std::atomic<bool>* stop_requested = nullptr;
  // Times steps, emulated device waits and the liveness rules. Not owned;
  // must outlive the worker.
  Clock* clock = SystemClock();
  // Unset: WorkerTimeouts::FromJob(job).
  std::optional<WorkerTimeouts> timeouts;
  // Identifies this run of the worker to the site (HELLO.incarnation);
  // 0: a random non-zero number.
  uint64_t incarnation = 0;
  // When the site whose server the worker connects to lists
  // worker_curve_public_key (and security.curve is on): the workers' CURVE
  // secret key file (mode 0600); empty: $MERIDIAN_SECRET_KEY, else
  // <security.key_dir>/workers/<serving site>.key (security.h
  // WorkerSecretKeyPath). Ignored otherwise.
  std::string secret_key_file;
};

class Worker {
 public:
  // Loads the worker's share of the training data and builds its model.
  static Result<std::unique_ptr<Worker>> Create(WorkerOptions options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Joins the site, trains and commits until the server says stop (then
  // says BYE) or stop_requested is set. Errors: the server refuses the
  // worker (another layout, another process took its index ...), keeps
  // refusing its commits, or stays gone past fault.worker_give_up_s.
  Status Run();

  const pb::WorkerStats& stats() const;

 private:
  class Impl;
  explicit Worker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meridian

#endif  // MERIDIAN_WORKER_WORKER_H_
