// Number formatting shared by the runtime's log lines and messages.
#ifndef MERIDIAN_RUNTIME_FORMAT_H_
#define MERIDIAN_RUNTIME_FORMAT_H_

#include <cstdio>
#include <string>

namespace meridian {

// "12.5": seconds with `decimals` digits after the point, for log lines.
inline std::string FormatSeconds(double s, int decimals = 1) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, s);
  return buf;
}

}  // namespace meridian

#endif  // MERIDIAN_RUNTIME_FORMAT_H_
