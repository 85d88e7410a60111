#include "wan/host_port.h"

#include <algorithm>
#include <string>

namespace meridian::wan {

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) {
    return "[" + host + "]:" + std::to_string(port);
  }
  return host + ":" + std::to_string(port);
}

Result<HostPort> ParseHostPort(std::string_view text, bool allow_port_zero) {
  const std::string original(text.substr(0, 200));
  if (text.rfind("tcp://", 0) == 0) text.remove_prefix(6);
  HostPort out;
  std::string_view port_text;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() ||
        text[close + 1] != ':') {
      return InvalidArgumentError("address '" + original +
                                  "': expected [IPv6]:PORT");
    }
    out.host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      return InvalidArgumentError("address '" + original +
                                  "': expected HOST:PORT");
    }
    out.host = std::string(text.substr(0, colon));
    if (out.host.find(':') != std::string::npos) {
      return InvalidArgumentError("address '" + original +
                                  "': write IPv6 hosts as [addr]:PORT");
    }
    port_text = text.substr(colon + 1);
  }
  if (out.host.empty()) {
    return InvalidArgumentError("address '" + original + "': empty host");
  }
  if (out.host == "*") out.host = "0.0.0.0";
  for (char c : out.host) {
    if (static_cast<unsigned char>(c) <= ' ' || c == '/' || c == '[' ||
        c == ']') {
      return InvalidArgumentError("address '" + original +
                                  "': bad character in host");
    }
  }
  if (port_text == "*") port_text = "0";
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    return InvalidArgumentError("address '" + original +
                                "': the port must be a number 0-65535");
  }
  const unsigned long port = std::stoul(std::string(port_text));
  if (port > 65535) {
    return InvalidArgumentError("address '" + original +
                                "': the port must be a number 0-65535");
  }
  if (port == 0 && !allow_port_zero) {
    return InvalidArgumentError("address '" + original +
                                "': port 0 is only allowed for listening");
  }
  out.port = static_cast<uint16_t>(port);
  return out;
}

}  // namespace meridian::wan
