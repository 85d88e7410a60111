// The launcher's side of the WAN emulator (`meridian wanem`): the control
// channel to its live process, the routes the launcher added through it
// (re-added on the same listen ports when a new process starts, so the
// sites' connections find them again), and the reads of its counters into
// run.json (about once per kWanPollPeriodS, and a final one before it is
// stopped), so the traffic of every wanem process reaches the report.
//
// Ownership and threads: owned by the launcher's JobRun and used by the
// thread that called RunJob alone (its monitor loop); not thread-safe.
// Time is seconds on JobRun's stopwatch.
// Blocking: the periodic read of the counters (Poll) waits at most
// kCounterPollTimeout (50 ms) for wanem, so a dead or frozen wanem does not
// hold up the monitor loop; the one-time calls (routes, the final counters)
// wait up to kControlTimeout (2 s).
// Size: one route per pair of sites that talk and per worker behind an
// access link, fixed once every role has started; two control clients (setup
// and counters) of the live process.
#ifndef MERIDIAN_LAUNCH_WANEM_CONTROL_H_
#define MERIDIAN_LAUNCH_WANEM_CONTROL_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "meridian/core/clock.h"
#include "meridian/job.pb.h"
#include "meridian/core/status.h"
#include "meridian/wan/control.h"
#include "launch/run_manifest.h"

namespace meridian {

// How long a control call of the launcher waits for wanem: the one-time
// calls (routes, the final counters), and the periodic read of the
// counters, which runs in the monitor loop and must not delay it.
inline constexpr auto kControlTimeout = std::chrono::seconds(2);
inline constexpr auto kCounterPollTimeout = std::chrono::milliseconds(50);

class WanemControl {
 public:
  // `job`, `manifest` and `wall` are not owned and outlive this.
  WanemControl(const pb::JobConfig& job, RunManifestFile* manifest,
               const Stopwatch* wall);
  WanemControl(const WanemControl&) = delete;
  WanemControl& operator=(const WanemControl&) = delete;

  // A new wanem process listens for control at `endpoint`: a new entry of
  // the manifest, counting from 0; every route is to be added to it again.
  void Connect(const std::string& endpoint);
  bool connected() const { return client_ != nullptr; }
  // The live process's control endpoint; only while connected().
  const std::string& endpoint() const { return client_->endpoint(); }
  size_t routes() const { return routes_.size(); }

  // The endpoint site `from` uses to reach `target` (a ZeroMQ tcp endpoint
  // of site `to`): a wanem listener forwarding to it, or `target` itself
  // without wanem. The route is recorded to be re-added on a restart.
  Result<std::string> Route(int from, int to, const std::string& target);
  // The endpoint worker `index` of site `site` uses to reach its server at
  // `target` over its access link (workers.link), as Route.
  Result<std::string> RouteWorker(int site, uint32_t index,
                                  const std::string& target);
  // Every route wanem had, on the same listen address, so the sites'
  // connections find their ports again. Unavailable while one is missing.
  Status ReAddRoutes();

  // Reads the live process's counters into the manifest, about once per
  // kWanPollPeriodS, so a crash loses at most the traffic since the last
  // read. Call only while the process runs (the launcher checks it with
  // waitpid right before). Waits at most kCounterPollTimeout: a read that
  // is not answered in time is skipped, the next one comes a period later.
  void Poll();
  // Every site server is done: the counters are final. Reads them once
  // more, marked final (an error is logged).
  void ReadFinal();
  // wanem's process ended: unless its final counters were read, what it
  // carried since the last read is not counted.
  void Ended();

 private:
  // A wanem route the launcher added: re-added with the same listen
  // address when wanem restarts.
  struct RouteRecord {
    std::string link;
    std::string from_site;
    std::string listen;  // HOST:PORT as bound by the first wanem
    std::string forward;
  };

  void ReadCounters(wan::ControlClient& client, bool final);
  // Adds a route on `link` from its end `from_end` to `target`.
  Result<std::string> AddRoute(std::string link, std::string from_end,
                               const std::string& target);

  const pb::JobConfig& job_;
  RunManifestFile* const manifest_;
  const Stopwatch* const wall_;
  // The live wanem's: routes and the final counters (kControlTimeout),
  // and the periodic counters (kCounterPollTimeout).
  std::unique_ptr<wan::ControlClient> client_;
  std::unique_ptr<wan::ControlClient> poll_client_;
  std::vector<RouteRecord> routes_;
  std::vector<bool> routes_added_;  // to the live wanem process
  double next_poll_s_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_LAUNCH_WANEM_CONTROL_H_
