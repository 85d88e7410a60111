// `meridian wanem`: the WAN emulator as a process. The command line only
// parses flags and calls these functions.
//
//   meridian wanem --listen HOST:PORT --forward HOST:PORT
//                  [--bandwidth R] [--latency T] [--jitter T] [--control EP]
//       one link "client-server", both directions alike, one route from
//       "client" (connect to --listen) to --forward.
//   meridian wanem --config JOB [--control EP] [--ready-fd N]
//       every link of the job (ResolveJobLinks), no routes: they are added
//       at run time over the control endpoint (WanAddRoute).
//   meridian wanem ctl [--control EP] status | set | partition | heal |
//                      add-route ...
//
// Driving it from a launcher: spawn `meridian wanem --config JOB --control
// tcp://127.0.0.1:0 --ready-fd 3`, read the line "ready <endpoint>\n" from
// fd 3, then use a ControlClient on <endpoint>: AddRoute() for every pair
// of sites that exchange traffic (listen "127.0.0.1:0" picks a port; the
// reply has the bound address), GetStatus() for the counters
// (LinkTrafficFromReply / TrafficCsvRows). SIGTERM stops it cleanly.
#ifndef MERIDIAN_WAN_WANEM_H_
#define MERIDIAN_WAN_WANEM_H_

#include <atomic>
#include <string>
#include <string_view>
#include <vector>

#include "meridian/core/clock.h"
#include "meridian/core/status.h"
#include "meridian/job.pb.h"
#include "meridian/wan/link_model.h"
#include "meridian/wan_control.pb.h"

namespace meridian::wan {

// Control endpoint used when neither the flag nor the job sets one.
inline constexpr std::string_view kDefaultControlEndpoint =
    "tcp://127.0.0.1:7300";

struct WanemOptions {
  std::vector<LinkModel> links;
  std::vector<RouteSpec> routes;  // opened at start
  // ZeroMQ endpoint of the control server; "none" or empty: no control.
  // Port 0 (or *) binds a free port.
  std::string control = std::string(kDefaultControlEndpoint);
  // When >= 0: once every listener and the control endpoint are up, write
  // "ready <control endpoint>\n" ("ready none\n" without control) to this
  // fd and close it.
  int ready_fd = -1;
  // When set: append a traffic sample (TrafficCsvRows) of every link
  // direction every sample_period_s to this file.
  std::string traffic_csv;
  double sample_period_s = 1.0;
  // "HOST:PORT" of the metrics endpoint (per link direction: bytes,
  // messages, queued bytes, bandwidth, latency; port 0: any free port);
  // empty or "none": no endpoint. When set, the ready line also says
  // " metrics=<bound HOST:PORT>". A bind failure is logged and wanem runs
  // on without one.
  std::string metrics_address;
  const Clock* clock = SystemClock();
  // The emulator's connection caps (EmulatorOptions, wan/emulator.h). A
  // job's wanem raises them to what the job itself may open: every worker
  // of the largest site can cross one route (a site whose server_site is
  // another), so a flood is refused and a job's own workers never are.
  size_t max_connections_per_route = 64;
  size_t max_connections = 1024;
};

// The one-link form: sites "client" and "server", link "client-server",
// one route from "client". Empty bandwidth = "unlimited", empty latency /
// jitter = "0"; units as in wan_units.h.
Result<WanemOptions> OneLinkWanemOptions(
    std::string_view listen, std::string_view forward,
    std::string_view bandwidth, std::string_view latency,
    std::string_view jitter, std::string_view jitter_distribution = {},
    std::string_view queue_limit = {});

// The job form: every link of `job` (ResolveJobLinks), no routes, control
// at job.wan().control_address() unless `control` is non-empty, metrics at
// job.wan().metrics_address(). When
// job.wan().emulate() is false every link between sites is passthrough
// (bytes are still counted, nothing is shaped). The workers' access links
// (ResolveWorkerLinks) follow, always shaped.
Result<WanemOptions> JobWanemOptions(const pb::JobConfig& job,
                                     std::string_view control);

// Runs the emulator until `*stop` becomes true (checked every 50 ms; may be
// null: run forever). Returns an error when it cannot start (a listen
// address in use, a control endpoint that does not bind, ...).
Status RunWanem(const WanemOptions& options, const std::atomic<bool>* stop);

// `meridian wanem ctl`: sends `request` to `endpoint` and puts what to
// print (the link table for status, the bound address for add-route, "ok"
// otherwise) in `output`. Exit codes for the command line: 0 done,
// 1 refused or unreachable (`output` says why).
int RunWanemCtl(const std::string& endpoint,
                const pb::WanControlRequest& request, std::string* output);

}  // namespace meridian::wan

#endif  // MERIDIAN_WAN_WANEM_H_
