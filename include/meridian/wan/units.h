// Units of the WAN emulator, written as Linux tc writes them.
//
//   rates  "100mbit", "1gbit", "500kbit", "1.5gbit", "64kibit", "10mbps"
//          (bps = BYTES per second, as in tc), a bare number of bit/s, or
//          "unlimited" (no pacing). SI prefixes are powers of 1000, the
//          "i" forms powers of 1024. Between 1kbit and 1tbit.
//   times  "40ms", "500us", "1.5s" (also sec/secs, msec/msecs,
//          usec/usecs). A bare number is refused, except "0": tc reads it
//          as microseconds, which is a classic mistake. Between 0 and 60s.
//   sizes  "64kb", "4mb", "1gb", "512k" (k/kb/m/mb/g/gb are powers of 1024
//          as in tc; kib/mib/gib too), "b" or a bare number of bytes. At
//          least 1 byte, at most 64 GiB.
// Units are case-insensitive; no spaces. Errors say what was wrong and
// what is accepted.
#ifndef MERIDIAN_WAN_UNITS_H_
#define MERIDIAN_WAN_UNITS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "meridian/core/clock.h"
#include "meridian/core/status.h"

namespace meridian::wan {

// Bits per second; 0 means "unlimited" (the only way to get 0).
Result<double> ParseBandwidth(std::string_view text);
// A non-negative duration.
Result<Duration> ParseDuration(std::string_view text);
// A positive number of bytes.
Result<uint64_t> ParseByteSize(std::string_view text);

// The shortest tc-style spelling: "100mbit", "1.5gbit", "unlimited" (0).
std::string FormatBandwidth(double bits_per_second);
// "40ms", "500us", "1.5s", "0ms".
std::string FormatDuration(Duration duration);
// "64KiB", "1.5MiB", "100B".
std::string FormatBytes(uint64_t bytes);

}  // namespace meridian::wan

#endif  // MERIDIAN_WAN_UNITS_H_
