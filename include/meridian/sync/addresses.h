// Where each role of a job listens and whom it connects to, when roles run
// on their own (by hand, in containers, in network namespaces) from one job
// file. `meridian run` wires its own ephemeral ports instead and uses none
// of this except the bind rule.
//
// Precedence: a role's flags, then the environment, then the job file.
//
// Environment (read by ApplyAddressOverrides):
//   MERIDIAN_SITE_<NAME>_ADDRESS         site.address
//   MERIDIAN_SITE_<NAME>_MIRROR_ADDRESS  site.mirror_address
//   MERIDIAN_WANEM_HOST                  wan.wanem_host
// where <NAME> is the site name upper-cased with every character that is not
// a letter or digit replaced by '_'. Role-specific variables (MERIDIAN_BIND,
// MERIDIAN_MIRROR_BIND, MERIDIAN_CONNECT) are read by the command line.
#ifndef MERIDIAN_SYNC_ADDRESSES_H_
#define MERIDIAN_SYNC_ADDRESSES_H_

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meridian/job.pb.h"
#include "meridian/core/status.h"

namespace meridian {

// Looks up an environment variable; nullopt when unset. Injected so tests
// need not touch the process environment.
using EnvLookup = std::function<std::optional<std::string>(std::string_view)>;
// The process environment (getenv).
EnvLookup ProcessEnvironment();

// "MERIDIAN_SITE_<NAME>_<what>" for site `site_name`.
std::string SiteEnvVariable(std::string_view site_name, std::string_view what);

// Replaces addresses in `job` by the environment's (see above) and
// re-validates them: a malformed override is InvalidArgument naming the
// variable and its value. Unset variables change nothing.
Status ApplyAddressOverrides(pb::JobConfig* job, const EnvLookup& env);

// The endpoint a server binds for the endpoint it is reached at: unchanged
// when the host is an IP address, "localhost" or "*"; tcp://*:PORT when it
// is a name (a DNS name of this host or a Kubernetes Service, which ZeroMQ
// cannot bind). Non-tcp endpoints are returned unchanged.
std::string BindEndpointFor(const std::string& address);

// One wanem listener of a standalone deployment (wan.wanem_host set).
struct StaticRoute {
  std::string link;       // "a-b", a before b in file order
  std::string from_site;  // the site whose processes connect
  std::string to_site;
  bool workers = false;   // workers of from_site reaching to_site's server
  uint32_t port = 0;      // route_base_port + ...
  std::string listen;     // wanem_bind_host:port
  std::string forward;    // host:port of to_site's mirror_address / address
};

// Every route a standalone wanem opens for `job` (empty when
// wan.wanem_host is unset): a sync route for each ordered pair of sites
// that exchange updates, a worker route for each site whose server_site is
// another site. Precondition: a validated config.
std::vector<StaticRoute> StaticRoutes(const pb::JobConfig& job);

// Where site `from`'s server sends its updates for site `to` on its own:
// through wanem's route when wan.wanem_host is set, `to`'s mirror_address
// otherwise.
std::string PeerMirrorEndpoint(const pb::JobConfig& job, int from, int to);

// Where the workers of site `site` reach their server on their own: their
// site's address, or the serving site's (through wanem's worker route when
// wan.wanem_host is set).
std::string WorkerServerEndpoint(const pb::JobConfig& job, int site);

}  // namespace meridian

#endif  // MERIDIAN_SYNC_ADDRESSES_H_
