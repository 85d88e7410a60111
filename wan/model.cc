#include <algorithm>
#include <cmath>
#include <string>

#include "wan/model.h"
#include "meridian/wan/units.h"

namespace meridian::wan {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;
// Smallest explicit queue limit: less would make the reader crawl.
constexpr uint64_t kMinQueueLimit = 1024;

std::string FieldName(std::string_view prefix, std::string_view name) {
  if (prefix.empty()) return std::string(name);
  return std::string(prefix) + "." + std::string(name);
}

}  // namespace

DirectionModel DefaultDirectionModel() { return DirectionModel{}; }

uint64_t DefaultQueueLimit(const DirectionModel& model) {
  if (model.bandwidth_bps <= 0) return 16 * kMiB;
  const double seconds = ToSeconds(model.latency + model.jitter);
  const double bdp_bytes = model.bandwidth_bps / 8.0 * seconds;
  const double limit = std::max<double>(kMiB, 2.0 * bdp_bytes);
  // The largest bandwidth (1tbit) x latency (60s) x 2 fits in 2^64.
  return static_cast<uint64_t>(std::ceil(limit));
}

size_t ChunkBytes(const DirectionModel& model, size_t max_bytes) {
  if (model.bandwidth_bps <= 0) return max_bytes;
  const double per_ms = model.bandwidth_bps / 8.0 / 1000.0;
  const double clamped = std::clamp(
      per_ms, 64.0, static_cast<double>(std::max<size_t>(64, max_bytes)));
  return static_cast<size_t>(clamped);
}

Status ApplyDirectionConfig(const pb::LinkDirectionConfig& change,
                            std::string_view prefix, DirectionModel* model) {
  DirectionModel next = *model;
  if (change.has_bandwidth()) {
    Result<double> bps = ParseBandwidth(change.bandwidth());
    if (!bps.ok()) {
      return bps.status().WithContext(FieldName(prefix, "bandwidth"));
    }
    next.bandwidth_bps = *bps;
  }
  if (change.has_latency()) {
    Result<Duration> latency = ParseDuration(change.latency());
    if (!latency.ok()) {
      return latency.status().WithContext(FieldName(prefix, "latency"));
    }
    next.latency = *latency;
  }
  if (change.has_jitter()) {
    Result<Duration> jitter = ParseDuration(change.jitter());
    if (!jitter.ok()) {
      return jitter.status().WithContext(FieldName(prefix, "jitter"));
    }
    next.jitter = *jitter;
  }
  if (change.has_jitter_distribution()) {
    switch (change.jitter_distribution()) {
      case pb::JITTER_UNIFORM:
      case pb::JITTER_NORMAL:
        next.jitter_distribution = change.jitter_distribution();
        break;
      default:
        return InvalidArgumentError(
            FieldName(prefix, "jitter_distribution") +
            ": must be JITTER_UNIFORM or JITTER_NORMAL");
    }
  }
  if (change.has_queue_limit()) {
    Result<uint64_t> limit = ParseByteSize(change.queue_limit());
    if (!limit.ok()) {
      return limit.status().WithContext(FieldName(prefix, "queue_limit"));
    }
    if (*limit < kMinQueueLimit) {
      return InvalidArgumentError(FieldName(prefix, "queue_limit") +
                                  ": at least 1kb");
    }
    next.queue_limit_bytes = *limit;
  }
  *model = next;
  return Status::Ok();
}

std::string DescribeDirection(const DirectionModel& model) {
  std::string out = FormatBandwidth(model.bandwidth_bps) + " " +
                    FormatDuration(model.latency);
  if (model.jitter > Duration::zero()) {
    out += " jitter " + FormatDuration(model.jitter) +
           (model.jitter_distribution == pb::JITTER_NORMAL ? "(normal)"
                                                           : "(uniform)");
  }
  out += " queue " + FormatBytes(EffectiveQueueLimit(model));
  if (model.queue_limit_bytes == 0) out += "(auto)";
  return out;
}

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
