// `meridian top`: a live table of every site of a job, from the processes'
// metrics endpoints (include/meridian/metrics.h).
#ifndef MERIDIAN_REPORT_TOP_H_
#define MERIDIAN_REPORT_TOP_H_

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "meridian/job.pb.h"
#include "meridian/metrics/metrics.h"
#include "meridian/core/status.h"

namespace meridian {

// A process to scrape.
struct TopTarget {
  std::string name;     // the site's name, or "wanem"
  std::string role;     // "site" or "wanem"
  std::string address;  // metrics HOST:PORT; empty: none configured
  // What `meridian run` last said of the process (endpoints.json), e.g.
  // "restarting (attempt 2 of 10)"; empty when unknown.
  std::string state;
};

// Every site server of `job` (site.metrics_address) and its standalone
// wanem (wan.metrics_address, when set). A wildcard host (0.0.0.0, *) is
// reached at the host of the site's address (wanem: wan.wanem_host), or
// 127.0.0.1 when that is a wildcard too.
std::vector<TopTarget> TopTargetsFromJob(const pb::JobConfig& job);

// The processes listed in `run_dir`/endpoints.json (written by `meridian
// run`). Errors name the file.
Result<std::vector<TopTarget>> TopTargetsFromRun(const std::string& run_dir);

// One scrape of a target: its samples, or why it could not be read.
struct TopScrape {
  bool up = false;
  std::string error;  // when !up
  std::vector<MetricSample> samples;
  // When !up: seconds since the target last answered (RunTop tracks it
  // across rounds); < 0 when unknown.
  double silent_s = -1;
};

// The table of one round of scrapes (`scrapes[i]` of `targets[i]`): one
// row per site (site, state, train time, accuracy, clock, theta,
// commits/s, WAN MB out/in, commit staleness, clock lag, queue), and a
// line per wanem. The state of a site that did not answer is its
// launcher's "restarting (attempt k of n)" when known, else "down (no
// answer for N s)"; a training site's state adds the workers declared dead
// and the peers unreachable when there are any.
std::string FormatTopTable(const std::vector<TopTarget>& targets,
                           const std::vector<TopScrape>& scrapes);

// Scrapes every target (in parallel, each within `timeout_s`).
std::vector<TopScrape> ScrapeTargets(const std::vector<TopTarget>& targets,
                                     double timeout_s);

struct TopOptions {
  std::vector<TopTarget> targets;
  // A `meridian run` directory: its endpoints.json is read again every
  // round (a restarted process serves its metrics on a new port), and
  // `targets` replaced when it reads.
  std::string run_dir;
  double interval_s = 2.0;
  bool once = false;  // one table, then return
  std::FILE* out = stdout;
  // Polled between rounds; may be null. Not owned.
  const std::atomic<bool>* stop = nullptr;
};

// Prints the table every interval_s until `stop` (or once): redrawn in
// place on a terminal, one table after another otherwise. Unreachable
// processes are shown as down; nothing here fails.
void RunTop(const TopOptions& options);

}  // namespace meridian

#endif  // MERIDIAN_REPORT_TOP_H_
