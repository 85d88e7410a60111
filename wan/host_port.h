// "host:port" addresses of the emulator's routes and sockets (private to
// wan/).
#ifndef MERIDIAN_WAN_HOST_PORT_H_
#define MERIDIAN_WAN_HOST_PORT_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "meridian/core/status.h"

namespace meridian::wan {

// Splits "host:port", "[v6addr]:port" or "tcp://host:port" into host and
// port. `allow_port_zero`: listen addresses may ask for a free port.
struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string ToString() const;  // "host:port" ("[v6]:port" for IPv6)
};
Result<HostPort> ParseHostPort(std::string_view text, bool allow_port_zero);

}  // namespace meridian::wan

#endif  // MERIDIAN_WAN_HOST_PORT_H_
