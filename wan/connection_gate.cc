#include "wan/connection_gate.h"

#include <sys/resource.h>

#include <algorithm>

namespace meridian::wan {

uint64_t RaiseDescriptorLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return limit.rlim_cur == RLIM_INFINITY ? UINT64_MAX : limit.rlim_cur;
}

uint64_t DescriptorLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  return limit.rlim_cur == RLIM_INFINITY ? UINT64_MAX : limit.rlim_cur;
}

ConnectionGate::ConnectionGate(size_t max_total, size_t max_per_route,
                               uint64_t descriptor_limit)
    : max_total_(std::max<uint64_t>(
          1, std::min<uint64_t>(
                 max_total, descriptor_limit > kReservedDescriptors
                                ? (descriptor_limit - kReservedDescriptors) /
                                      kDescriptorsPerConnection
                                : 0))),
      max_per_route_(std::max<size_t>(1, max_per_route)) {}

std::optional<std::string> ConnectionGate::TryAdmit(size_t route_open) {
  if (route_open >= max_per_route_) {
    return std::to_string(route_open) +
           " connections open on this route (max_connections_per_route)";
  }
  size_t open = open_.load();
  do {
    if (open >= max_total_) {
      return std::to_string(open) +
             " connections open on all routes (max_connections, at most " +
             std::to_string(max_total_) + " here)";
    }
  } while (!open_.compare_exchange_weak(open, open + 1));
  return std::nullopt;
}

void ConnectionGate::Release() { open_.fetch_sub(1); }

}  // namespace meridian::wan
