#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

#include "meridian/wan/units.h"

namespace meridian::wan {
namespace {

struct Unit {
  std::string_view name;
  double factor;
};

// Rates, in bit/s per unit (tc-bandwidth(8)).
constexpr Unit kRateUnits[] = {
    {"bit", 1},
    {"kbit", 1e3},
    {"mbit", 1e6},
    {"gbit", 1e9},
    {"tbit", 1e12},
    {"kibit", 1024.0},
    {"mibit", 1048576.0},
    {"gibit", 1073741824.0},
    {"tibit", 1099511627776.0},
    {"bps", 8},
    {"kbps", 8e3},
    {"mbps", 8e6},
    {"gbps", 8e9},
    {"tbps", 8e12},
    {"kibps", 8 * 1024.0},
    {"mibps", 8 * 1048576.0},
    {"gibps", 8 * 1073741824.0},
    {"tibps", 8 * 1099511627776.0},
};

// Times, in seconds per unit (tc(8) "TIMES").
constexpr Unit kTimeUnits[] = {
    {"s", 1},     {"sec", 1},     {"secs", 1},
    {"ms", 1e-3}, {"msec", 1e-3}, {"msecs", 1e-3},
    {"us", 1e-6}, {"usec", 1e-6}, {"usecs", 1e-6},
};

// Sizes, in bytes per unit (tc(8) "SIZES": k/kb/m/mb/g/gb are binary).
constexpr Unit kSizeUnits[] = {
    {"b", 1},
    {"k", 1024.0},
    {"kb", 1024.0},
    {"kib", 1024.0},
    {"m", 1048576.0},
    {"mb", 1048576.0},
    {"mib", 1048576.0},
    {"g", 1073741824.0},
    {"gb", 1073741824.0},
    {"gib", 1073741824.0},
};

std::string Quoted(std::string_view text) {
  std::string out = "'";
  for (char c : text.substr(0, 64)) {
    out += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  }
  if (text.size() > 64) out += "...";
  return out + "'";
}

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

template <size_t N>
std::string UnitList(const Unit (&units)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) out += ", ";
    out += units[i].name;
  }
  return out;
}

// Splits "12.5mbit" into 12.5 and "mbit". The number is digits with an
// optional fraction (no sign, no exponent, no hex, no inf/nan).
struct NumberAndUnit {
  double value = 0;
  std::string unit;  // lower case
  bool negative = false;
};

Result<NumberAndUnit> SplitNumber(std::string_view text,
                                  std::string_view what) {
  if (text.empty())
    return InvalidArgumentError(std::string(what) + " is empty");
  NumberAndUnit out;
  size_t pos = 0;
  if (text[0] == '-' || text[0] == '+') {
    out.negative = text[0] == '-';
    pos = 1;
  }
  const size_t digits_begin = pos;
  bool seen_digit = false;
  bool seen_point = false;
  while (pos < text.size()) {
    const char c = text[pos];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      seen_digit = true;
    } else if (c == '.' && !seen_point) {
      seen_point = true;
    } else {
      break;
    }
    ++pos;
  }
  if (!seen_digit) {
    return InvalidArgumentError(std::string(what) + " " + Quoted(text) +
                                " does not start with a number");
  }
  const std::string number(text.substr(digits_begin, pos - digits_begin));
  if (number.size() > 40) {
    return InvalidArgumentError(std::string(what) + " " + Quoted(text) +
                                " has too many digits");
  }
  char* end = nullptr;
  out.value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(out.value)) {
    return InvalidArgumentError(std::string(what) + " " + Quoted(text) +
                                " is not a number");
  }
  out.unit = Lower(text.substr(pos));
  return out;
}

template <size_t N>
const Unit* FindUnit(const Unit (&units)[N], std::string_view name) {
  for (const Unit& unit : units) {
    if (unit.name == name) return &unit;
  }
  return nullptr;
}

// "%g" without trailing zeros and with up to 6 significant digits.
std::string Number(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.6g", value);
  return buffer;
}

}  // namespace

Result<double> ParseBandwidth(std::string_view text) {
  constexpr std::string_view kWhat = "bandwidth";
  if (Lower(text) == "unlimited") return 0.0;
  MERIDIAN_ASSIGN_OR_RETURN(NumberAndUnit parsed, SplitNumber(text, kWhat));
  double factor = 1;  // a bare number is bit/s, as in tc
  if (!parsed.unit.empty()) {
    const Unit* unit = FindUnit(kRateUnits, parsed.unit);
    if (unit == nullptr) {
      return InvalidArgumentError(
          "bandwidth " + Quoted(text) + ": unknown unit " +
          Quoted(parsed.unit) + "; use one of " + UnitList(kRateUnits) +
          " (tc units: bps = bytes/s), a bare number of bit/s, or "
          "'unlimited'");
    }
    factor = unit->factor;
  }
  if (parsed.negative || parsed.value == 0) {
    return InvalidArgumentError("bandwidth " + Quoted(text) +
                                " must be positive (write 'unlimited' for "
                                "no limit)");
  }
  const double bps = parsed.value * factor;
  if (bps < 1e3 || bps > 1e12) {
    return InvalidArgumentError("bandwidth " + Quoted(text) +
                                " is out of range: between 1kbit and 1tbit");
  }
  return bps;
}

Result<Duration> ParseDuration(std::string_view text) {
  constexpr std::string_view kWhat = "time";
  MERIDIAN_ASSIGN_OR_RETURN(NumberAndUnit parsed, SplitNumber(text, kWhat));
  if (parsed.negative && parsed.value != 0) {
    return InvalidArgumentError("time " + Quoted(text) +
                                " must not be negative");
  }
  if (parsed.unit.empty()) {
    if (parsed.value == 0) return Duration::zero();
    return InvalidArgumentError(
        "time " + Quoted(text) +
        " needs a unit (tc reads a bare number as microseconds): write e.g. "
        "40ms, 500us or 1.5s");
  }
  const Unit* unit = FindUnit(kTimeUnits, parsed.unit);
  if (unit == nullptr) {
    return InvalidArgumentError("time " + Quoted(text) + ": unknown unit " +
                                Quoted(parsed.unit) + "; use one of " +
                                UnitList(kTimeUnits));
  }
  const double seconds = parsed.value * unit->factor;
  if (seconds > 60) {
    return InvalidArgumentError("time " + Quoted(text) +
                                " is out of range: at most 60s");
  }
  return Duration(static_cast<int64_t>(std::llround(seconds * 1e9)));
}

Result<uint64_t> ParseByteSize(std::string_view text) {
  constexpr std::string_view kWhat = "size";
  MERIDIAN_ASSIGN_OR_RETURN(NumberAndUnit parsed, SplitNumber(text, kWhat));
  double factor = 1;
  if (!parsed.unit.empty()) {
    const Unit* unit = FindUnit(kSizeUnits, parsed.unit);
    if (unit == nullptr) {
      return InvalidArgumentError("size " + Quoted(text) + ": unknown unit " +
                                  Quoted(parsed.unit) + "; use one of " +
                                  UnitList(kSizeUnits) +
                                  " (binary, as in tc) or a bare number of "
                                  "bytes");
    }
    factor = unit->factor;
  }
  if (parsed.negative || parsed.value == 0) {
    return InvalidArgumentError("size " + Quoted(text) + " must be positive");
  }
  const double bytes = std::round(parsed.value * factor);
  if (bytes < 1 || bytes > 64.0 * 1073741824.0) {
    return InvalidArgumentError("size " + Quoted(text) +
                                " is out of range: 1 byte to 64gb");
  }
  return static_cast<uint64_t>(bytes);
}

std::string FormatBandwidth(double bps) {
  if (bps <= 0) return "unlimited";
  if (bps >= 1e12) return Number(bps / 1e12) + "tbit";
  if (bps >= 1e9) return Number(bps / 1e9) + "gbit";
  if (bps >= 1e6) return Number(bps / 1e6) + "mbit";
  if (bps >= 1e3) return Number(bps / 1e3) + "kbit";
  return Number(bps) + "bit";
}

std::string FormatDuration(Duration duration) {
  const double ns = static_cast<double>(duration.count());
  if (ns == 0) return "0ms";
  if (ns >= 1e9) return Number(ns / 1e9) + "s";
  if (ns >= 1e6) return Number(ns / 1e6) + "ms";
  return Number(ns / 1e3) + "us";
}

std::string FormatBytes(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  char text[32];
  auto in = [&](double unit, const char* name) {
    std::snprintf(text, sizeof(text), "%.4g%s", b / unit, name);
    return std::string(text);
  };
  if (b >= 1073741824.0) return in(1073741824.0, "GiB");
  if (b >= 1048576.0) return in(1048576.0, "MiB");
  if (b >= 1024.0) return in(1024.0, "KiB");
  return std::to_string(bytes) + "B";
}

}  // namespace meridian::wan
