// Small number helpers shared by the runtime: formatting for log lines and
// messages, and defaults for unset job settings.
#ifndef MERIDIAN_CORE_FORMAT_H_
#define MERIDIAN_CORE_FORMAT_H_

#include <cmath>
#include <cstdio>
#include <string>

namespace meridian {

// "12.5": seconds with `decimals` digits after the point, for log lines.
inline std::string FormatSeconds(double s, int decimals = 1) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, s);
  return buf;
}

// "0.5", "1e-06", "inf": `value` as printf's %g writes it (six significant
// digits), for messages and configuration issues.
inline std::string FormatReal(double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", value);
  return buf;
}

// A positive, finite setting, or `fallback` (the job file left it unset or
// zero).
inline double Positive(double value, double fallback) {
  return std::isfinite(value) && value > 0 ? value : fallback;
}

}  // namespace meridian

#endif  // MERIDIAN_CORE_FORMAT_H_
