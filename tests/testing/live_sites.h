// Several live site servers syncing with each other (threads of the test
// process, real ZeroMQ sockets on loopback), each fed by one scripted
// worker: what the sync-conservation tests, in plaintext and over CURVE,
// run before checking that every site ends with every update once.
#ifndef MERIDIAN_TESTS_TESTING_LIVE_SITES_H_
#define MERIDIAN_TESTS_TESTING_LIVE_SITES_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meridian/job.pb.h"
#include "meridian/site/site_server.h"
#include "meridian/core/status.h"
#include "meridian/wan/control.h"

namespace meridian::testing {

struct LiveSitesRun {
  // One per site, in job order, finished (Run returned).
  std::vector<std::unique_ptr<SiteServer>> servers;
  // The model every site should hold: the seeded initial model plus every
  // committed update divided by the job's worker count (the MEAN rule).
  std::vector<double> expected;
};

// Starts a server for every site of `job` (each runs its own; bound to
// free loopback ports), tells each where its sync peers listen (what the
// launcher does), runs one RunScriptedWorker per site (`commits` commits,
// seed seed_base + site index) and waits until every server has finished.
// The model dimensions are those of the synthetic data (784 in, 10 out).
// Errors: a server that does not start, refuses its peers, or ends with an
// error, or a worker that fails — every server has stopped by then.
Result<LiveSitesRun> RunLiveSites(const pb::JobConfig& job, int commits,
                                  uint64_t seed_base,
                                  std::chrono::milliseconds timeout);

// The same with faults: the sites' connections to each other go through a
// `meridian wanem` process (one route per site pair and direction, through
// its control endpoint, as `meridian run` does), the workers pace their
// commits, and `during` runs on its own thread meanwhile — a partition, a
// reset of a link's connections — and must return before the run ends.
struct LiveSitesOptions {
  int commits = 10;
  uint64_t seed_base = 1;
  std::chrono::milliseconds timeout{60000};
  std::chrono::milliseconds commit_interval{0};
  bool through_wanem = false;
  // The meridian binary to run wanem from (tests: MERIDIAN_BINARY).
  std::string meridian_binary;
  // Where the job file wanem reads and its log go.
  std::string work_dir;
  std::function<void(wan::ControlClient* wanem)> during;
  // Called once every server listens, before the sites meet, with each
  // site's mirror endpoint in job order (e.g. to start hostile peers of
  // the mirror sockets); must return at once.
  std::function<void(const std::vector<std::string>& mirror_endpoints)>
      on_listening;
};
Result<LiveSitesRun> RunLiveSites(const pb::JobConfig& job,
                                  const LiveSitesOptions& options);

// Elements of `model` farther than `tolerance` from `expected`; the first
// few are described in `*first` (may be null).
size_t CountMismatches(const std::vector<float>& model,
                       const std::vector<double>& expected, double tolerance,
                       std::string* first);

// What breaks conservation in a finished run, one line per site at fault:
// a site that missed a peer's final flush, or whose model is not
// run.expected (within 1e-4; the first mismatches described). Empty when
// every site flushed and holds every update exactly once.
std::string EveryUpdateOnceProblems(const pb::JobConfig& job,
                                    const LiveSitesRun& run);

}  // namespace meridian::testing

#endif  // MERIDIAN_TESTS_TESTING_LIVE_SITES_H_
