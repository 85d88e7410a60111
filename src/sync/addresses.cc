#include "meridian/sync/addresses.h"

#include <arpa/inet.h>

#include <cctype>
#include <cstdlib>

#include "meridian/config/config.h"
#include "meridian/sync/sync.h"

namespace meridian {
namespace {

constexpr std::string_view kTcp = "tcp://";

// Splits "tcp://HOST:PORT" into HOST and PORT; false for other forms.
// IPv6 hosts come bracketed ("[::1]:7100").
bool SplitTcp(std::string_view endpoint, std::string_view* host,
              std::string_view* port) {
  if (endpoint.substr(0, kTcp.size()) != kTcp) return false;
  const std::string_view rest = endpoint.substr(kTcp.size());
  const size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0 ||
      colon + 1 == rest.size()) {
    return false;
  }
  *host = rest.substr(0, colon);
  *port = rest.substr(colon + 1);
  return true;
}

bool IsIpLiteral(std::string_view host) {
  std::string text(host);
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    text = text.substr(1, text.size() - 2);
  }
  unsigned char buf[sizeof(struct in6_addr)];
  return ::inet_pton(AF_INET, text.c_str(), buf) == 1 ||
         ::inet_pton(AF_INET6, text.c_str(), buf) == 1;
}

// "HOST:PORT" of a tcp endpoint (the form wanem listens on and forwards to).
std::string HostPort(const std::string& endpoint) {
  return endpoint.substr(0, kTcp.size()) == kTcp
             ? endpoint.substr(kTcp.size())
             : endpoint;
}

uint32_t SyncRoutePort(const pb::JobConfig& job, int from, int to) {
  const uint32_t s = static_cast<uint32_t>(job.site_size());
  return job.wan().route_base_port() + static_cast<uint32_t>(from) * s +
         static_cast<uint32_t>(to);
}

uint32_t WorkerRoutePort(const pb::JobConfig& job, int from, int to) {
  const uint32_t s = static_cast<uint32_t>(job.site_size());
  return job.wan().route_base_port() + s * s +
         static_cast<uint32_t>(from) * s + static_cast<uint32_t>(to);
}

std::string LinkName(const pb::JobConfig& job, int x, int y) {
  const int a = std::min(x, y);
  const int b = std::max(x, y);
  return job.site(a).name() + "-" + job.site(b).name();
}

bool UsesWanem(const pb::JobConfig& job) {
  return !job.wan().wanem_host().empty();
}

std::string WanemEndpoint(const pb::JobConfig& job, uint32_t port) {
  return std::string(kTcp) + job.wan().wanem_host() + ":" +
         std::to_string(port);
}

Status CheckEndpointOverride(const std::string& variable,
                             const std::string& value) {
  std::string_view host, port;
  if (value.rfind("ipc://", 0) == 0 || value.rfind("inproc://", 0) == 0) {
    return Status::Ok();
  }
  if (!SplitTcp(value, &host, &port)) {
    return InvalidArgumentError(
        variable + "='" + value +
        "' is not a ZeroMQ endpoint: expected tcp://HOST:PORT, ipc://PATH "
        "or inproc://NAME");
  }
  return Status::Ok();
}

}  // namespace

EnvLookup ProcessEnvironment() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

std::string SiteEnvVariable(std::string_view site_name,
                            std::string_view what) {
  std::string name = "MERIDIAN_SITE_";
  for (char c : site_name) {
    const unsigned char u = static_cast<unsigned char>(c);
    name += std::isalnum(u) ? static_cast<char>(std::toupper(u)) : '_';
  }
  name += "_";
  name += what;
  return name;
}

Status ApplyAddressOverrides(pb::JobConfig* job, const EnvLookup& env) {
  for (pb::SiteConfig& site : *job->mutable_site()) {
    const std::string address_var = SiteEnvVariable(site.name(), "ADDRESS");
    if (std::optional<std::string> value = env(address_var)) {
      MERIDIAN_RETURN_IF_ERROR(CheckEndpointOverride(address_var, *value));
      site.set_address(*value);
    }
    const std::string mirror_var =
        SiteEnvVariable(site.name(), "MIRROR_ADDRESS");
    if (std::optional<std::string> value = env(mirror_var)) {
      MERIDIAN_RETURN_IF_ERROR(CheckEndpointOverride(mirror_var, *value));
      site.set_mirror_address(*value);
    }
  }
  if (std::optional<std::string> host = env("MERIDIAN_WANEM_HOST")) {
    if (host->find_first_of(":/ ") != std::string::npos) {
      return InvalidArgumentError("MERIDIAN_WANEM_HOST='" + *host +
                                  "' must be a host name or IPv4 address "
                                  "(no scheme, no port)");
    }
    job->mutable_wan()->set_wanem_host(*host);
  }
  return Status::Ok();
}

std::string BindEndpointFor(const std::string& address) {
  std::string_view host, port;
  if (!SplitTcp(address, &host, &port)) return address;
  if (host == "*" || host == "localhost" || IsIpLiteral(host)) return address;
  return std::string(kTcp) + "*:" + std::string(port);
}

std::vector<StaticRoute> StaticRoutes(const pb::JobConfig& job) {
  std::vector<StaticRoute> routes;
  if (!UsesWanem(job)) return routes;
  const std::string& bind_host = job.wan().wanem_bind_host();
  auto add = [&](int from, int to, bool workers) {
    StaticRoute route;
    route.link = LinkName(job, from, to);
    route.from_site = job.site(from).name();
    route.to_site = job.site(to).name();
    route.workers = workers;
    route.port = workers ? WorkerRoutePort(job, from, to)
                         : SyncRoutePort(job, from, to);
    route.listen = bind_host + ":" + std::to_string(route.port);
    route.forward = HostPort(workers ? job.site(to).address()
                                     : job.site(to).mirror_address());
    routes.push_back(std::move(route));
  };
  for (int from = 0; from < job.site_size(); ++from) {
    if (HasServer(job.site(from)) && job.sync().kind() != pb::SYNC_NONE) {
      for (int to : RoleOf(job, from).Peers()) add(from, to, false);
    }
  }
  for (int from = 0; from < job.site_size(); ++from) {
    const int serving = ServingSite(job, from);
    if (serving != from) add(from, serving, true);
  }
  return routes;
}

std::string PeerMirrorEndpoint(const pb::JobConfig& job, int from, int to) {
  if (!UsesWanem(job)) return job.site(to).mirror_address();
  return WanemEndpoint(job, SyncRoutePort(job, from, to));
}

std::string WorkerServerEndpoint(const pb::JobConfig& job, int site) {
  const int serving = ServingSite(job, site);
  if (serving == site) return job.site(site).address();
  if (!UsesWanem(job)) return job.site(serving).address();
  return WanemEndpoint(job, WorkerRoutePort(job, site, serving));
}

}  // namespace meridian
